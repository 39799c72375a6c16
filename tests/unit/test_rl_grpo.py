import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.rl.forward import forward_completions
from prime_swarm.libs.rl.grpo import GRPOConfig, Rollout, grpo_step
from prime_swarm.libs.rl.logprobs import token_logprobs


def _seq_logprob(model, prompt, comp):
    with torch.no_grad():
        logits, _, targets, mask = forward_completions(model, [(prompt, comp)])
        return float(token_logprobs(logits, targets, 1.0)[mask].sum())


def test_step_moves_probability_toward_the_better_completion():
    torch.manual_seed(0)
    model = init_tiny_model(0)
    prompt, good, bad = [1, 5, 6], [7, 8, 2], [9, 9, 2]
    rollouts = []
    for comp, reward in ((good, 1.0), (bad, 0.0)):
        with torch.no_grad():
            logits, _, targets, _ = forward_completions(model, [(prompt, comp)])
        old = token_logprobs(logits, targets, 1.0)[0].tolist()
        rollouts.append(Rollout(prompt, comp, old, reward))
    before = _seq_logprob(model, prompt, good) - _seq_logprob(model, prompt, bad)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = grpo_step(model, opt, [rollouts], GRPOConfig())
    after = _seq_logprob(model, prompt, good) - _seq_logprob(model, prompt, bad)
    assert after > before
    assert stats["rollouts_used"] == 2.0 and stats["mean_ratio"] == 1.0
    assert stats["reward_mean"] == 0.5


def test_groups_without_signal_leave_weights_untouched():
    model = init_tiny_model(0)
    before = [p.clone() for p in model.parameters()]
    same = [Rollout([1, 5], [6, 2], [-1.0, -1.0], 0.5), Rollout([1, 5], [7, 2], [-1.0, -1.0], 0.5)]
    stats = grpo_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), [same])
    assert stats["rollouts_used"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
