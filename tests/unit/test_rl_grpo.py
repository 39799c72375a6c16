"""One GRPO step on the tiny Qwen2, with realistic ids: prompts start with BOS, completions end
with EOS. Float statistics are compared with tolerances: a step's forward runs with grad and in
train mode, the behaviour log-probs without, and multi-threaded kernels need not round alike."""

from __future__ import annotations

import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.forward import forward_completions
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, make_optimizer
from prime_swarm.libs.rl.loss import LossConfig
from prime_swarm.libs.rl.step import train_step

BOS, EOS = 257, 258


def _lm() -> CausalLM:
    return CausalLM(init_tiny_model(0), build_tokenizer())


def _answer(lm: CausalLM, text: str) -> list[int]:
    return [*lm.tokenizer(text, add_special_tokens=False)["input_ids"], EOS]


def _logprobs(lm: CausalLM, prompt: list[int], comp: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits, _, targets, mask = forward_completions(lm, [(prompt, comp)])
        return token_logprobs(logits, targets, temperature)[0][mask[0]].tolist()


def _seq_logprob(lm: CausalLM, prompt: list[int], comp: list[int]) -> float:
    return sum(_logprobs(lm, prompt, comp, 1.0))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_step_moves_probability_toward_the_better_completion(temperature: float) -> None:
    torch.manual_seed(0)
    lm = _lm()
    prompt = prompt_ids(lm.tokenizer, "rev 56=")
    good, bad = _answer(lm, "65"), _answer(lm, "99")
    assert prompt[0] == BOS and prompt.count(BOS) == 1 and good[-1] == EOS
    # Behaviour log-probs as the validator hands them over: of the lease's tempered distribution.
    rollouts = [
        Rollout(prompt, comp, _logprobs(lm, prompt, comp, temperature), reward, temperature)
        for comp, reward in ((good, 1.0), (bad, 0.0))
    ]
    before = _seq_logprob(lm, prompt, good) - _seq_logprob(lm, prompt, bad)
    stats = train_step(lm, make_optimizer(lm, lr=1e-2), [rollouts], GRPOConfig())
    after = _seq_logprob(lm, prompt, good) - _seq_logprob(lm, prompt, bad)
    assert after > before + 0.1
    assert not lm.module.training  # back in eval mode for generation
    assert stats["rollouts_used"] == 2.0 and stats["groups"] == 1.0
    assert stats["reward_mean"] == pytest.approx(0.5, abs=1e-12)
    assert stats["tokens"] == float(len(good) + len(bad))
    # The rollouts are on-policy: every ratio is 1, nothing clips, and advantages of +-1 over
    # equally long completions cancel in the mean.
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["clip_frac"] == pytest.approx(0.0, abs=1e-6)
    assert stats["loss"] == pytest.approx(0.0, abs=1e-5)
    assert stats["grad_norm"] > 0.0


def test_the_ratio_uses_the_rollout_temperature() -> None:
    lm = _lm()
    prompt = prompt_ids(lm.tokenizer, "rev 56=")
    good, bad = _answer(lm, "65"), _answer(lm, "99")
    # Log-probs of T=1 presented as a T=0.5 rollout: the importance weight (and, in classic
    # PPO, the ratio) sees the mismatch.
    rollouts = [
        Rollout(prompt, comp, _logprobs(lm, prompt, comp, 1.0), reward, temperature=0.5)
        for comp, reward in ((good, 1.0), (bad, 0.0))
    ]
    stats = train_step(lm, make_optimizer(lm, lr=1e-6), [rollouts])
    assert abs(stats["is_weight_mean"] - 1.0) > 1e-3
    classic = GRPOConfig(loss=LossConfig(ratio_against="generator"))
    stats = train_step(lm, make_optimizer(lm, lr=1e-6), [rollouts], classic)
    assert abs(stats["ratio_mean"] - 1.0) > 1e-3


def test_stale_behaviour_logprobs_are_clipped() -> None:
    lm = _lm()
    prompt = prompt_ids(lm.tokenizer, "rev 56=")
    good, bad = _answer(lm, "65"), _answer(lm, "99")
    # Behaviour log-probs one nat below the current policy: ratio e > 1 + clip_eps everywhere,
    # so the positive-advantage tokens are clipped (the negative ones are not: min() keeps them).
    rollouts = [
        Rollout(prompt, comp, [lp - 1.0 for lp in _logprobs(lm, prompt, comp, 1.0)], reward)
        for comp, reward in ((good, 1.0), (bad, 0.0))
    ]
    cfg = GRPOConfig(loss=LossConfig(eps_high=0.2, ratio_against="generator"))
    stats = train_step(lm, make_optimizer(lm), [rollouts], cfg)
    assert stats["ratio_mean"] == pytest.approx(torch.e, rel=1e-4)
    assert stats["clip_frac"] == pytest.approx(len(good) / (len(good) + len(bad)), abs=1e-6)


def test_groups_without_signal_leave_weights_untouched() -> None:
    lm = _lm()
    before = [p.detach().clone() for p in lm.module.parameters()]
    prompt = prompt_ids(lm.tokenizer, "rev 5=")
    same = [
        Rollout(prompt, _answer(lm, "5"), [-1.0, -1.0], 0.5),
        Rollout(prompt, _answer(lm, "7"), [-1.0, -1.0], 0.5),
    ]
    opt = make_optimizer(lm, lr=1e-2)
    stats = train_step(lm, opt, [same])
    assert stats["rollouts_used"] == 0.0 and stats["tokens"] == 0.0
    assert stats["reward_mean"] == pytest.approx(0.5, abs=1e-12)
    # No step at all (not a zero step: AdamW would still move weights through its state).
    assert not opt.state
    after = list(lm.module.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_group_without_signal_dilutes_the_step_as_its_tokens_count() -> None:
    """Zero-advantage rollouts skip the forward, but their tokens stay in the token mean (TRL's
    and DAPO's): beside a silent group of as many tokens, the same informative group's gradient
    is exactly half."""
    prompt = prompt_ids(build_tokenizer(), "rev 56=")
    silent_prompt = prompt_ids(build_tokenizer(), "rev 12=")
    grads = []
    for with_silent in (False, True):
        lm = _lm()
        group = [
            Rollout(prompt, c, _logprobs(lm, prompt, c, 1.0), r)
            for c, r in ((_answer(lm, "65"), 1.0), (_answer(lm, "99"), 0.0))
        ]
        silent = [
            Rollout(silent_prompt, c, _logprobs(lm, silent_prompt, c, 1.0), 0.0)
            for c in (_answer(lm, "21"), _answer(lm, "44"))
        ]
        opt = torch.optim.SGD(lm.module.parameters(), lr=0.0)
        # No clipping: the comparison is of the raw gradients.
        stats = train_step(
            lm, opt, [group, silent] if with_silent else [group], GRPOConfig(max_grad_norm=1e9)
        )
        assert stats["rollouts_used"] == 2.0  # the silent group never reached the forward
        grads.append([p.grad.clone() for p in lm.module.parameters()])
    for alone, diluted in zip(*grads, strict=True):
        assert torch.allclose(diluted, alone / 2, atol=1e-7)


def test_behaviour_logprobs_must_match_the_completion() -> None:
    lm = _lm()
    prompt = prompt_ids(lm.tokenizer, "rev 5=")
    group = [
        Rollout(prompt, _answer(lm, "5"), [-1.0], 1.0),  # one log-prob for two tokens
        Rollout(prompt, _answer(lm, "7"), [-1.0, -1.0], 0.0),
    ]
    with pytest.raises(ValueError, match="one entry per completion token"):
        train_step(lm, make_optimizer(lm), [group])


def test_micro_batches_accumulate_to_the_one_batch_gradient() -> None:
    """Splitting a step into micro-batches (gradient accumulation) changes nothing but memory."""
    prompt_a = prompt_ids(build_tokenizer(), "rev 56=")
    prompt_b = prompt_ids(build_tokenizer(), "rev 1234=")
    grads = []
    for budget in (10_000, 12):  # one forward, or one sequence per forward
        torch.manual_seed(0)
        lm = _lm()
        groups = [
            [
                Rollout(p, _answer(lm, a), _logprobs(lm, p, _answer(lm, a), 1.0), r)
                for a, r in answers
            ]
            for p, answers in (
                (prompt_a, (("65", 1.0), ("9", 0.0))),
                (prompt_b, (("4321", 1.0), ("43", 0.5), ("1", 0.0))),
            )
        ]
        opt = torch.optim.SGD(lm.module.parameters(), lr=0.0)
        cfg = GRPOConfig(micro_batch_tokens=budget)
        stats = train_step(lm, opt, groups, cfg)
        grads.append(([p.grad.clone() for p in lm.module.parameters()], stats))
    (g1, s1), (g2, s2) = grads
    assert s1["tokens"] == s2["tokens"]
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prompt"])
def test_environment_tokens_get_no_gradient(layout: str) -> None:
    """A multi-turn branch trains on the model's turns only: the environment's reply between
    them is context. Whatever its tokens and behaviour log-probs, the step is the same, and its
    token count is the sampled tokens'."""
    lm = _lm()
    prompt = prompt_ids(lm.tokenizer, "guess:")
    turn1, turn2 = _answer(lm, "4"), _answer(lm, "6")

    def step(reply: str, reply_logprob: float) -> tuple[dict[str, float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = _lm()
        ctx = lm.tokenizer(reply, add_special_tokens=False)["input_ids"]
        comps = [turn1 + ctx + turn2, turn2 + ctx + turn1]
        spans = [[0, len(turn1)], [len(turn1) + len(ctx), len(comps[0])]]
        rollouts = []
        for comp, reward in zip(comps, (1.0, 0.0), strict=True):
            lps = _logprobs(model, prompt, comp, 1.0)
            for k in range(spans[0][1], spans[1][0]):
                lps[k] = reply_logprob
            rollouts.append(Rollout(prompt, comp, lps, reward, sampled_spans=spans))
        stats = train_step(
            model, make_optimizer(model, lr=1e-2), [rollouts], GRPOConfig(layout=layout)
        )  # type: ignore[arg-type]
        return stats, [p.detach().clone() for p in model.module.parameters()]

    stats_a, params_a = step("+\n", -3.0)
    stats_b, params_b = step("+\n", -30.0)  # behaviour log-probs at context: ignored
    assert stats_a["tokens"] == float(2 * (len(turn1) + len(turn2)))
    assert stats_a["clip_frac"] == stats_b["clip_frac"] == 0.0
    for a, b in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
