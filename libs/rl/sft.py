"""Warm start: a short, deliberately imperfect supervised run before RL.

The demonstrations come from a noisy teacher that makes the env's systematic mistake at
`error_rate`. The model learns the task's structure and format, but with the mistake as its
greedy choice, so RL starts from a policy whose samples contain the right answer often enough for
GRPO to find and reinforce it: headroom that only RL can close.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.io import load_pretrained, save_pretrained, weights_sha256
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rl.defaults import WARM_START, WarmStartConfig
from prime_swarm.libs.rl.forward import forward_completions
from prime_swarm.libs.rollout.episode import Limits, next_context
from prime_swarm.protocol.messages import sampled_mask

MARKER_FILE = "warm_start.json"
# Bump when the recipe changes so cached warm starts from an older recipe are rebuilt.
RECIPE_VERSION = 4
Progress = Callable[[int, int, float], None]
"""(step, total steps, loss) after each logged SFT step."""


def _base(base: str | Path | int) -> tuple[CausalLM, dict[str, object]]:
    if isinstance(base, int):
        return CausalLM(init_tiny_model(base), build_tokenizer()), {"base_seed": base}
    return load_pretrained(base), {"base_weights_sha256": weights_sha256(base)}


def _marker_matches(out: Path, params: dict[str, object]) -> bool:
    try:
        return json.loads((out / MARKER_FILE).read_text()) == params
    except (OSError, ValueError):
        return False


def _lr_factor(step: int, total: int, warmup: int = 20, floor: float = 0.1) -> float:
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))
    return min(1.0, (step + 1) / warmup) * (floor + (1.0 - floor) * cosine)


def train_sft(
    model: CausalLM, cfg: WarmStartConfig, seed: int, progress: Progress | None = None
) -> list[float]:
    """Cross-entropy on noisy-teacher demonstrations; returns the loss curve."""
    env = load_env(cfg.env, cfg.env_args)
    tok = model.tokenizer
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.module.parameters(), lr=cfg.lr, weight_decay=0.0)
    # Cosine decay lets the short run settle into the teacher's mixture on every seed, instead
    # of stopping half-way with some garbled outputs; that keeps the RL starting point uniform.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: _lr_factor(k, cfg.steps))
    losses = []
    model.module.train()
    for step in range(cfg.steps):
        tasks = env.sample_tasks(seed * 1_000_003 + step, cfg.batch_size, "train")
        pairs, sampled = [], []
        for t in tasks:
            prompt = prompt_ids(tok, t.prompt)
            turns = env.demonstration(t, rng, cfg.error_rate)
            completion, spans = demonstrated(env, t, model, prompt, turns)
            pairs.append((prompt, completion))
            sampled.append(sampled_mask(spans, len(completion)))
        logits, _, targets, mask = forward_completions(model, pairs)
        # The loss covers the model's turns, never the environment's replies between them.
        for i, row in enumerate(sampled):
            mask[i, : len(row)] &= torch.tensor(row, device=mask.device)
        loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.module.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None and ((step + 1) % 50 == 0 or step + 1 == cfg.steps):
            progress(step + 1, cfg.steps, losses[-1])
    model.module.eval()
    return losses


def demonstrated(
    env: Env, task: Task, model: CausalLM, prompt: list[int], turns: list[str]
) -> tuple[list[int], list[list[int]]]:
    """A demonstration's tokens after the prompt and its turns' spans: each turn's text then
    EOS, and between turns the environment's reply by the episode rule the worker plays by
    (libs/rollout/episode.py); the demonstration stops where the episode would."""
    tok, eos = model.tokenizer, min(model.eos_ids)
    # Any turn length is allowed: the demonstration's turns are the env's own.
    limits = Limits(max_new_tokens=1, budget=model.context_len - len(prompt))
    completion: list[int] = []
    spans: list[list[int]] = []
    for text in turns:
        start = len(completion)
        completion += [*tok(text, add_special_tokens=False)["input_ids"], eos]
        spans.append([start, len(completion)])
        said = [completion[a:b] for a, b in spans]
        reply = next_context(env, task, tok, model.eos_ids, said, len(completion), limits)
        if reply is None:
            break
        completion += reply
    # A reply after the last demonstrated turn leads nowhere: the branch ends at its EOS.
    return completion[: spans[-1][1]], spans


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    # Several services may start at once and ask for the same warm start: one trains, the
    # others wait and then find the marker.
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def warm_start(
    base: str | Path | int,
    out_dir: str | Path,
    *,
    seed: int,
    steps: int | None = None,
    cfg: WarmStartConfig = WARM_START,
    progress: Progress | None = None,
    **overrides: object,
) -> Path:
    """Build (or reuse) the warm-started policy in `out_dir` as a Hugging Face model directory.

    `base` is a model directory or a seed for a fresh tiny model. `steps` and the keyword
    overrides replace fields of `cfg` (e.g. error_rate=0.5), validated. A completed run with
    identical parameters (marker file) is reused without training.
    """
    if steps is not None:
        overrides["steps"] = steps
    cfg = WarmStartConfig.model_validate({**cfg.model_dump(), **overrides})
    out = Path(out_dir)
    model, base_params = _base(base)
    params = {"recipe": RECIPE_VERSION, "seed": seed, **base_params, **cfg.model_dump()}
    with _exclusive(out):
        if _marker_matches(out, params):
            return out
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            train_sft(model, cfg, seed, progress)
        save_pretrained(model, model.tokenizer, out)
        # Written last: a marker present means the model beside it is complete.
        tmp = out / f".{MARKER_FILE}.tmp"
        tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out / MARKER_FILE)
    return out
