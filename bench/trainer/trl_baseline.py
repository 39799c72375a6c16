"""The TRL baseline for `make bench-trainer`: the same GRPO run with Hugging Face TRL's GRPOTrainer.

Same model (a warm-started tiny Qwen2 directory, or SmolLM2), same env and train prompts (chat
messages rendered by the model's template, token for token what our workers see), same rollout
budget (steps x prompts_per_step x group_size completions), same sampling (temperature, token cap,
no top-k/top-p), same optimizer (AdamW, constant lr, no weight decay, grad-norm clip 1.0), and
the held-out greedy reward measured with our own evaluator. TRL runs it all in one process on the
CPU: generate, score, one optimizer step, repeat.

    .venv/bin/pip install -e '.[bench-trainer]'
    .venv/bin/python -m bench.trainer.trl_baseline --steps 40 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from prime_swarm.deploy.local.cli import heldout, prepare_model
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.environments.reward import score
from prime_swarm.libs.model.io import save_pretrained
from prime_swarm.libs.model.tokenizer import chat_messages, prompt_ids
from prime_swarm.libs.rl.defaults import RL, WARM_START
from prime_swarm.libs.rl.loss import LossConfig
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.task_stream import task_at
from prime_swarm.protocol.messages import Prompt


def trl_prompts(tok, prompts: list[Prompt]) -> list[str]:
    """Each prompt as the text TRL's plain `tok(text)` turns into exactly our `prompt_ids`.

    Chat messages are rendered by the model's template, as `prompt_ids` renders them. A raw
    prompt gets the BOS token written as text where our rule prepends it and the tokenizer would
    not (Qwen2's adds no BOS): the tokenizer emits it as the special token. Checked per prompt.
    """
    out = []
    for p in prompts:
        if tok.chat_template:
            messages = [m.model_dump() for m in chat_messages(p)]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            assert isinstance(p, str), "chat messages need a model with a chat template here"
            bos = tok.bos_token_id
            add_bos = bos is not None and tok(p)["input_ids"][:1] != [bos]
            text = (tok.bos_token if add_bos else "") + p
        got = list(tok(text)["input_ids"])
        if got != prompt_ids(tok, p):
            raise RuntimeError(f"TRL's tokenization of {p!r} ({got}) differs from prompt_ids")
        out.append(text)
    return out


def run_trl(
    model_dir: Path,
    s: LocalNetworkSettings,
    *,
    seed: int = 0,
    threads: int = 2,
    budget_s: float | None = None,
    checkpoints: Path | None = None,
    save_every: int = 1,
) -> dict:
    """Train `model_dir` with TRL's GRPOTrainer on what the local network `s` runs (its
    environments and their weights, recipe, steps, groups per step, learning rate, held-out
    evaluation); timings, rewards and TRL's own per-step log. With `budget_s`, training also
    ends with the step in progress once that many seconds have passed since the end of the
    first step, as the network's bench run does.

    With `checkpoints`, every `save_every`-th step's model (and the last) is saved there as
    `step-N` and listed under `saved` with its time; the time spent saving is taken off the
    clock, and the held-out evaluation is left to the caller."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    model_dir = Path(model_dir)
    recipe = s.recipe
    envs = recipe.environments()
    steps, prompts_per_step, group_size = s.steps, s.groups_per_step, recipe.group_size
    reward_start = heldout(model_dir, s) if checkpoints is None else None

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True, use_safetensors=True
    )
    # One prompt per (step, group), drawn as the pool's orchestrator draws its leases (the
    # environment by weight, then one of its train tasks): the sampler repeats each
    # num_generations times.
    drawn = [
        task_at(recipe, envs, seed, i, train_tasks=s.train_tasks)
        for i in range(steps * prompts_per_step)
    ]
    dataset = Dataset.from_dict(
        {
            "prompt": trl_prompts(tok, [t.prompt for _, t in drawn]),
            "env": [share.env for share, _ in drawn],
            "task_id": [t.task_id for _, t in drawn],
        }
    )

    def env_reward(prompts, completions, env, task_id, **_kwargs) -> list[float]:
        # TRL decodes completions with skip_special_tokens=True, as our `decode` does. The
        # task part and, where the recipe weighs it, the format part, as the validator scores.
        out = []
        for name, i, c in zip(env, task_id, completions, strict=True):
            e = envs[name]
            task = e.task_from_id(i)
            fmt = e.format_score(task, [c]) if recipe.format_reward else None
            parts = score(
                e.score(task, [c]), 0, None, recipe.length_reward, fmt, recipe.format_reward
            )
            out.append(parts.total)
        return out

    env_reward.__name__ = "pool_reward"

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.train_begin = 0.0
            self.threads_seen = 0
            self.paused = 0.0  # seconds spent saving checkpoints, off the clock
            self.saved: list[list] = []

        def now(self) -> float:
            return time.perf_counter() - self.paused

        def on_train_begin(self, args, state, control, **kwargs):
            self.train_begin = self.now()
            self.threads_seen = torch.get_num_threads()

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(self.now())

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.end.append(self.now())
            n = len(self.end)
            last = n >= steps or (budget_s is not None and self.end[-1] - self.end[0] >= budget_s)
            if last:
                control.should_training_stop = True
            if checkpoints is not None and (last or n % save_every == 0):
                t0 = time.perf_counter()
                save_pretrained(model, tok, checkpoints / f"step-{n}")
                self.saved.append([round(self.end[-1] - self.end[0], 1), n, f"step-{n}"])
                self.paused += time.perf_counter() - t0

    batch = prompts_per_step * group_size
    with tempfile.TemporaryDirectory(prefix="trl-baseline-") as tmp:
        cfg = GRPOConfig(
            output_dir=str(Path(tmp) / "out"),
            # One optimizer step = prompts_per_step groups of group_size completions, generated as
            # one batch and trained as one batch (no accumulation), like our trainer's step.
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            num_generations=group_size,
            max_steps=steps,
            max_completion_length=recipe.max_new_tokens,
            temperature=recipe.temperature,
            top_p=1.0,
            top_k=0,  # 0 = no top-k filter: plain tempered sampling, as our workers do
            learning_rate=s.lr,
            lr_scheduler_type="constant",  # ours: constant lr (TrainingArguments' default decays)
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=RL.max_grad_norm,
            # beta=0: no KL term, so TRL builds no reference model (our trainer has none either).
            beta=0.0,
            # Plain GRPO as ours computes it: loss_type="dapo" (TRL's default) averages the
            # clipped surrogate over every completion token of the step, the zero-advantage
            # groups' tokens counted in the denominator as ours counts them (grpo.plan_step),
            # scale_rewards="group" divides by the group's std (TRL: Bessel-corrected,
            # eps 1e-4; ours: population std, eps 1e-6), and epsilon is the PPO clip. With
            # num_iterations=1 the ratio is exactly 1 (on-policy), so the clip never binds.
            loss_type="dapo",
            scale_rewards="group",
            epsilon=LossConfig().eps_high,
            num_iterations=1,
            mask_truncated_completions=False,
            # TRL turns gradient checkpointing on by default. Besides recomputing activations, it
            # toggles it off/on around every generation round, and transformers 5's
            # gradient_checkpointing_enable() adds an embedding forward hook each time
            # (enable_input_require_grads) that disable never removes: the hooks pile up and the
            # steps slow down over the run (measured here: 0.145 -> ~0.20 s/step in 80 steps).
            gradient_checkpointing=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            seed=seed,
            data_seed=seed,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
        )
        timer = Timer()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[env_reward],
            args=cfg,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[timer],
        )
        # With disable_tqdm the Trainer prints every log dict to stdout; keep stdout for JSON.
        trainer.remove_callback(PrinterCallback)
        torch.set_num_threads(threads)  # in case accelerate's setup changed it
        t0 = timer.now()
        trainer.train()
        wall_s = timer.now() - t0

        reward_end = None
        if checkpoints is None:
            final_dir = Path(tmp) / "final"
            save_pretrained(trainer.model, tok, final_dir)
            reward_end = heldout(final_dir, s)

    marks = [timer.train_begin, *timer.end]
    step_times = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    inside = [e - b for b, e in zip(timer.begin, timer.end, strict=False)]
    logs = [h for h in trainer.state.log_history if "reward" in h]
    completions = len(timer.end) * batch
    # The network's rate is taken from the end of its first step (start-up, the first fetch
    # and batch apart): TRL's the same way, beside the rate over its whole train() call.
    window = timer.end[-1] - timer.end[0] if len(timer.end) > 1 else 0.0
    half = max(len(step_times) // 2, 1)
    return {
        "impl": "trl",
        "trl_version": __import__("trl").__version__,
        "steps": len(timer.end),
        "completions": completions,
        # From the end of the first step to the end of the last, as the network's wall_s.
        "wall_s": round(window, 3),
        "train_call_s": round(wall_s, 3),
        "step_s": round(statistics.median(step_times), 4) if step_times else None,
        # Drift check: TRL with gradient checkpointing grows slower step by step.
        "step_s_first_half": round(statistics.median(step_times[:half]), 4) if step_times else None,
        "step_s_second_half": round(statistics.median(step_times[half:]), 4)
        if step_times[half:]
        else None,
        "step_s_max": round(max(step_times), 4) if step_times else None,
        "step_s_all": [round(t, 4) for t in step_times],
        # Share of each step spent between on_step_begin and on_step_end (generation + update).
        "step_inside_fraction": round(sum(inside) / max(sum(step_times), 1e-9), 4),
        # TRL is one synchronous process: it is always either generating or training, never
        # waiting on another component, so its one process is busy the whole run.
        "busy_fraction": 1.0,
        "completions_per_s": round((completions - batch) / window, 3) if window else None,
        "completions_per_s_train_call": round(completions / wall_s, 3),
        "ended_by": "budget" if len(timer.end) < steps else "steps",
        **(
            {
                "reward_start": round(reward_start, 4),
                "reward_end": round(reward_end, 4),
                "reward_gain": round(reward_end - reward_start, 4),
            }
            if reward_start is not None and reward_end is not None
            else {"saved": timer.saved}
        ),
        "train_reward_first": round(logs[0]["reward"], 4) if logs else None,
        "train_reward_last": round(logs[-1]["reward"], 4) if logs else None,
        "train_reward_last5": round(statistics.mean(h["reward"] for h in logs[-5:]), 4)
        if logs
        else None,
        "threads": timer.threads_seen,
        # (seconds since the end of the first step, mean sampled reward) at the end of each
        # step, as the network's curve.
        "reward_curve": [
            [round(t - timer.end[0], 1), round(h["reward"], 4)]
            for t, h in zip(timer.end, logs, strict=False)
        ],
        # Steps' share of groups whose completions all scored alike (zero advantage).
        "frac_reward_zero_std": round(
            statistics.mean(h.get("frac_reward_zero_std", 0.0) for h in logs), 4
        )
        if logs
        else None,
    }


def main() -> None:
    recipe = Recipe()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=None, help="warm-started model directory")
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache"))
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--warm-start-steps", type=int, default=WARM_START.steps)
    ap.add_argument("--env", default=recipe.env)
    ap.add_argument("--steps", type=int, default=RL.steps)
    ap.add_argument("--prompts", type=int, default=RL.prompts_per_step)
    ap.add_argument("--group-size", type=int, default=recipe.group_size)
    ap.add_argument("--max-new-tokens", type=int, default=recipe.max_new_tokens)
    ap.add_argument("--temperature", type=float, default=recipe.temperature)
    ap.add_argument("--lr", type=float, default=RL.lr)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-tasks", type=int, default=RL.eval_tasks)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    settings = LocalNetworkSettings(
        cache_dir=args.cache_dir,
        model_seed=args.model_seed,
        warm_start_steps=args.warm_start_steps,
        steps=args.steps,
        groups_per_step=args.prompts,
        lr=args.lr,
        eval_tasks=args.eval_tasks,
        recipe=Recipe(
            env=args.env,
            group_size=args.group_size,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
        ),
    )
    # The same warm-started directory `prime-swarm up` builds and reuses.
    model_dir = args.model_dir or prepare_model(settings, say=lambda m: print(m, file=sys.stderr))
    result = run_trl(model_dir, settings, seed=args.seed, threads=args.threads)
    config = {**vars(args), "model_dir": model_dir}
    print(json.dumps({"config": config, **result}, indent=1, default=str))


if __name__ == "__main__":
    main()
