import pytest
import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.rl.sampling import (
    completion_logprobs,
    generate,
    generate_batch,
    gumbel_noise,
    prefill,
    replay_check,
    sample_next,
    termination_ok,
)

EOS = 2


@pytest.fixture(scope="module")
def model():
    return init_tiny_model(0).eval()


def test_gumbel_noise_is_a_pure_function_of_its_key():
    a = gumbel_noise(12345, 3, 7, 5)
    assert torch.equal(a, gumbel_noise(12345, 3, 7, 5))
    # Pinned values: a validator on any machine must derive exactly these.
    pinned = [3.342750, -0.265442, 0.180362, 2.042003, 1.940216]
    assert a.tolist() == pytest.approx(pinned, abs=1e-5)
    for other in ((12346, 3, 7), (12345, 4, 7), (12345, 3, 8)):
        assert not torch.equal(a, gumbel_noise(*other, 5))
    # A larger vocabulary extends the same stream rather than reshuffling it.
    assert torch.equal(gumbel_noise(12345, 3, 7, 9)[:5], a)
    assert torch.isfinite(gumbel_noise(2**64 + 1, 0, 0, 1000)).all()


def test_sample_next():
    logits = torch.tensor([1.0, 3.0, 2.0])
    assert sample_next(logits, 0.0, torch.tensor([9.0, 0.0, 0.0])) == 1  # greedy ignores noise
    assert sample_next(logits, 1.0, torch.tensor([0.0, 0.0, 1.5])) == 2
    assert sample_next(logits, 0.5, torch.tensor([0.0, 0.0, 1.5])) == 1  # 6 > 4 + 1.5


def test_group_is_one_batch_and_replayable(model):
    prompt = [1, 5, 6, 7, 8]
    group = generate(
        model, prompt, group_size=4, max_new_tokens=6, temperature=1.0, seed=11, eos_id=EOS
    )
    again = generate(
        model, prompt, group_size=4, max_new_tokens=6, temperature=1.0, seed=11, eos_id=EOS
    )
    assert [c.token_ids for c in group] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in group}) > 1  # samples differ by sample_index
    for c in group:
        assert c.finish_reason == ("eos" if c.token_ids[-1] == EOS else "length")
        assert len(c.logprobs) == len(c.token_ids) <= 6
    # The same prompt inside a mixed, left-padded batch samples the same tokens.
    mixed = generate_batch(
        model,
        [[1, 9], prompt],
        [3, 11],
        group_size=4,
        max_new_tokens=6,
        temperature=1.0,
        eos_id=EOS,
    )
    assert [c.token_ids for c in mixed[1]] == [c.token_ids for c in group]


def test_prefill_batched_matches_unbatched(model):
    seqs = [([1, 5, 6, 7], [8, 9, EOS]), ([1, 4], [5, 6, 7, 8, 9]), ([1, 3, 3, 3, 3, 3], [EOS])]
    batched = prefill(model, seqs)
    for (prompt, comp), out in zip(seqs, batched, strict=True):
        one = prefill(model, [(prompt, comp)])[0]
        assert out.logits.shape == (len(comp), model.config.vocab_size)
        assert out.hidden.shape == (len(comp), model.config.n_embd)
        assert torch.allclose(out.logits, one.logits, atol=1e-5)
        assert torch.allclose(out.hidden, one.hidden, atol=1e-5)
        # Row k is the position before completion token k, in an unpadded full forward.
        with torch.no_grad():
            full_logits, full_hidden = model(torch.tensor([prompt + comp]))
        start = len(prompt) - 1
        assert torch.allclose(out.logits, full_logits[0, start : start + len(comp)], atol=1e-5)
        assert torch.allclose(out.hidden, full_hidden[0, start : start + len(comp)], atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_replay_accepts_honest_and_rejects_tampering(model, temperature):
    prompts = [[1, 5, 6, 7, 8], [1, 9, 9]]
    groups = generate_batch(
        model,
        prompts,
        [21, 22],
        group_size=3,
        max_new_tokens=6,
        temperature=temperature,
        eos_id=EOS,
    )
    seqs = [(p, c.token_ids) for p, g in zip(prompts, groups, strict=True) for c in g]
    outs = prefill(model, seqs)
    for k, ((_, toks), out) in enumerate(zip(seqs, outs, strict=True)):
        seed, idx = [21, 22][k // 3], k % 3
        assert replay_check(out.logits, toks, temperature, seed, idx) == (True, None)
        gen_lp = groups[k // 3][idx].logprobs
        assert completion_logprobs(out, toks, temperature) == pytest.approx(gen_lp, abs=1e-4)
        bad = list(toks)
        bad[1] = (bad[1] + 1) % model.config.vocab_size
        assert replay_check(outs[k].logits[:2], bad[:2], temperature, seed, idx) == (False, 1)
    if temperature > 0:
        # Honest tokens under someone else's seed do not pass.
        out, toks = outs[0], seqs[0][1]
        assert not replay_check(out.logits, toks, temperature, 999, 0)[0]


def test_termination_rules():
    assert termination_ok([5, 6, EOS], "eos", EOS, 4)
    assert termination_ok([5, 6, 7, 8], "length", EOS, 4)
    assert not termination_ok([5, EOS, 6, EOS], "eos", EOS, 4)  # ran past its first EOS
    assert not termination_ok([5, 6, 7], "length", EOS, 4)  # stopped early without EOS
    assert not termination_ok([5, EOS, 7, 8], "length", EOS, 4)
    assert not termination_ok([5, 6], "eos", EOS, 4)
