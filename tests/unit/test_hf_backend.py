"""The `hf` generation backend: seeded Gumbel-max sampling over a KV cache that a validator can
replay from its own prefill."""

from __future__ import annotations

import math

import pytest
import torch

from prime_swarm.libs.model.backend import Generation, make_backend
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.noise import gumbel_rows
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rollout.calibration import acceptance_for
from prime_swarm.libs.rollout.episode import termination_ok
from prime_swarm.libs.rollout.recompute import decode_logits, prefill_hidden, recompute
from prime_swarm.libs.rollout.verify import replay_gaps

EOS = 258
TEXTS = ["rev 4821=", "rev 7=", "rev 90817="]
SEEDS = [11, 22, 33]
GROUP, MAX_NEW = 4, 8


pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    """The untrained tiny model with its EOS row pointed along the mean final hidden state, so
    that sampling ends some completions at EOS and runs others to the cap (an untrained head
    almost never picks EOS on its own)."""
    module = init_tiny_model(0)
    tok = build_tokenizer()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids(tok, TEXTS[0]) + list(range(20, 40))])
        mean = module.model(ids).last_hidden_state[0].mean(0)
        module.lm_head.weight[EOS] = 3.0 * mean / mean.dot(mean)
    return CausalLM(module, tok)


@pytest.fixture(scope="module")
def prompts(lm: CausalLM) -> list[list[int]]:
    return [prompt_ids(lm.tokenizer, t) for t in TEXTS]


def _generate(
    lm: CausalLM,
    prompts: list[list[int]],
    seeds: list[int],
    precision: str = "bf16",
    group_size: int = GROUP,
    temperature: float = 1.0,
    max_new_tokens: int = MAX_NEW,
) -> list[list[Generation]]:
    return HFBackend(precision).generate(
        lm,
        prompts,
        seeds,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )


@pytest.fixture(scope="module")
def groups(lm: CausalLM, prompts: list[list[int]]) -> list[list[Generation]]:
    return _generate(lm, prompts, SEEDS)


def _tokens(group: list[Generation]) -> list[list[int]]:
    return [c.token_ids for c in group]


def test_generations_are_well_formed(lm: CausalLM, groups: list[list[Generation]]) -> None:
    assert [len(g) for g in groups] == [GROUP] * len(TEXTS)
    comps = [c for g in groups for c in g]
    for c in comps:
        assert 1 <= len(c.token_ids) <= MAX_NEW
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert all(0 <= t < lm.vocab_size for t in c.token_ids)
        assert termination_ok(c.token_ids, c.finish_reason, lm.eos_ids, MAX_NEW)
    # The fixture exercises both ways a completion ends.
    assert {c.finish_reason for c in comps} == {"eos", "length"}
    # Completions of a group differ: each sample index draws its own noise.
    assert all(len({tuple(t) for t in _tokens(g)}) > 1 for g in groups)


def test_a_group_is_replayable_whatever_the_batch(
    lm: CausalLM, prompts: list[list[int]], groups: list[list[Generation]]
) -> None:
    assert [_tokens(g) for g in _generate(lm, prompts, SEEDS)] == [_tokens(g) for g in groups]
    # Alone, in another order (other left padding), next to a duplicate of itself.
    (alone,) = _generate(lm, [prompts[1]], [SEEDS[1]])
    assert _tokens(alone) == _tokens(groups[1])
    reordered = _generate(lm, [prompts[2], prompts[0], prompts[1]], [SEEDS[2], SEEDS[0], SEEDS[1]])
    assert [_tokens(g) for g in reordered] == [_tokens(groups[i]) for i in (2, 0, 1)]
    twice = _generate(lm, [prompts[0], prompts[0]], [SEEDS[0], SEEDS[0]])
    assert _tokens(twice[0]) == _tokens(twice[1]) == _tokens(groups[0])
    # Sample j of a group depends on (seed, j) only, not on how large the group is.
    small = _generate(lm, prompts, SEEDS, group_size=2)
    assert [_tokens(g) for g in small] == [_tokens(g)[:2] for g in groups]
    # Another seed, other samples.
    other = _generate(lm, [prompts[0]], [SEEDS[0] + 1000])
    assert _tokens(other[0]) != _tokens(groups[0])


def test_the_second_opinions_decode_reproduces_the_workers_numbers(
    lm: CausalLM, prompts: list[list[int]], groups: list[list[Generation]]
) -> None:
    # The validator's second opinion re-runs the worker's path: a KV-cached bf16 decode of the
    # claimed tokens. Its log-probs match the worker's own up to batch composition (the worker
    # decoded every prompt in one left-padded batch, the recheck one group alone)...
    for p, g in zip(prompts, groups, strict=True):
        logits = decode_logits(lm, p, [c.token_ids for c in g], "bf16")
        for c, lg in zip(g, logits, strict=True):
            mine = token_logprobs(lg, torch.tensor(c.token_ids), 1.0)
            assert mine.tolist() == pytest.approx(c.logprobs, abs=0.05)
    # ...and in fp32 the decode equals a full forward: no cache or position bug.
    p, g = prompts[0], groups[0]
    fp32 = decode_logits(lm, p, [c.token_ids for c in g], "fp32")
    seqs = [(p, c.token_ids) for c in g]
    for lg, rec in zip(fp32, recompute(lm, seqs, "fp32"), strict=True):
        assert float((lg - lm.head_logits(rec.reference)).abs().max()) <= 1e-3


def test_fp32_cached_decode_equals_a_full_forward(lm: CausalLM, prompts: list[list[int]]) -> None:
    # In fp32 rounding noise is gone, so any disagreement would be a cache or position bug.
    groups = _generate(lm, prompts, SEEDS, precision="fp32")
    # And each token is the seeded Gumbel-max choice over an independent, unpadded forward.
    for p, seed, group in zip(prompts, SEEDS, groups, strict=True):
        for j, c in enumerate(group):
            with torch.no_grad():
                logits = lm.module(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
            for k, t in enumerate(c.token_ids):
                noise = gumbel_rows([(seed, j, k)], lm.vocab_size)[0]
                assert int((logits[k] + noise).argmax()) == t


@pytest.mark.parametrize("reference", ["bf16", "fp32"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_replay_accepts_honest_tokens_and_catches_a_tampered_one(
    lm: CausalLM, prompts: list[list[int]], temperature: float, reference: str
) -> None:
    tolerance = acceptance_for("hf").recheck.max_replay_gap
    groups = _generate(lm, prompts, SEEDS, temperature=temperature)
    seqs = [(p, c.token_ids) for p, g in zip(prompts, groups, strict=True) for c in g]
    # The validator recomputes in the declared precision; honest tokens replay in either.
    pre = prefill_hidden(lm, seqs, reference)
    choices: list[torch.Tensor] = []
    for n, ((_, toks), hidden) in enumerate(zip(seqs, pre, strict=True)):
        seed, j = SEEDS[n // GROUP], n % GROUP
        c = groups[n // GROUP][j]
        logits = lm.head_logits(hidden)
        gaps = replay_gaps(logits, toks, temperature, seed, j)
        assert gaps.shape == (len(toks),)
        assert float(gaps.max()) <= tolerance
        # The worker's log-probs are the validator's, up to bf16 decode/prefill noise.
        lp = token_logprobs(logits, torch.tensor(toks), temperature)
        assert lp.tolist() == pytest.approx(c.logprobs, abs=0.02)
        # Under someone else's seed or sample index the same tokens do not replay (a short
        # completion of likely tokens, such as a lone EOS, may: any seed would pick it).
        if len(toks) >= 4:
            assert float(replay_gaps(logits, toks, temperature, seed + 1, j).max()) > tolerance
            assert float(replay_gaps(logits, toks, temperature, seed, j + 1).max()) > tolerance
        # Every position tampered with: each is caught, and typically trails the seeded choice
        # by several units of tempered logit (the spread of the noise), not a near-tie.
        bad = [(t + 1) % lm.vocab_size for t in toks]
        bad_gaps = replay_gaps(logits, bad, temperature, seed, j)
        assert float(bad_gaps.min()) > tolerance
        assert float(bad_gaps.median()) > 2.0
        # How many tokens a cheater could pass off at each position: those within the tolerance
        # of the seeded choice.
        scores = logits.float() / temperature + gumbel_rows(
            [(seed, j, k) for k in range(len(toks))], lm.vocab_size
        )
        choices.append((scores.max(-1, keepdim=True).values - scores <= tolerance).sum(-1))
    # On a flat distribution about exp(tolerance) tokens lie within the tolerance of a Gumbel
    # maximum: the replay leaves a cheater that much choice on average, not a free pick.
    assert float(torch.cat(choices).float().mean()) <= 2 * math.exp(tolerance)


def test_greedy_is_the_argmax(lm: CausalLM, prompts: list[list[int]]) -> None:
    greedy = _generate(lm, prompts, SEEDS, temperature=0.0)
    # The noise is not used: the seed changes nothing and every sample of a group is the same.
    reseeded = _generate(lm, prompts, [7, 8, 9], temperature=0.0)
    assert [_tokens(g) for g in reseeded] == [_tokens(g) for g in greedy]
    # The worker's head: its bf16 copy's weights, applied in fp32 (hf_backend does the same).
    head = lm.cast("bf16").head_logits
    for p, g in zip(prompts, greedy, strict=True):
        assert all(t == g[0].token_ids for t in _tokens(g))
        proof_states = prefill_hidden(lm, [(p, c.token_ids) for c in g], "bf16")
        for c, hidden in zip(g, proof_states, strict=True):
            # The argmax of the fp32 logits over the proof's state (a prefill of the chosen
            # tokens: the decode's numbers up to bf16 noise, far from a greedy tie here)...
            assert head(hidden).argmax(-1).tolist() == c.token_ids
            # ...with the decode's log-probs of the untempered distribution, up to that noise.
            lp = token_logprobs(head(hidden), torch.tensor(c.token_ids), 0.0)
            assert lp.tolist() == pytest.approx(c.logprobs, abs=0.02)
    # In fp32, the argmax of a plain full forward at every position (teacher forcing).
    fp32 = _generate(lm, prompts, SEEDS, precision="fp32", temperature=0.0)
    for p, g in zip(prompts, fp32, strict=True):
        toks = g[0].token_ids
        with torch.no_grad():
            logits = lm.module(torch.tensor([p + toks])).logits[0, len(p) - 1 : -1]
        assert logits.argmax(-1).tolist() == toks
        assert replay_gaps(logits, toks, 0.0, 0, 0).max() == 0.0


def test_completions_stop_at_their_first_eos(lm: CausalLM, groups: list[list[Generation]]) -> None:
    for c in (c for g in groups for c in g):
        if c.finish_reason == "eos":
            assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == MAX_NEW and EOS not in c.token_ids


def test_termination_rules() -> None:
    eos = frozenset({EOS})
    assert termination_ok([5, 6, EOS], "eos", eos, 4)
    assert termination_ok([EOS], "eos", eos, 1)
    assert termination_ok([5, 6, 7, 8], "length", eos, 4)
    assert termination_ok([5, 6, 7, EOS], "eos", eos, 4)  # EOS as the last allowed token
    assert not termination_ok([5, EOS, 6, EOS], "eos", eos, 4)  # ran past its first EOS
    assert not termination_ok([5, 6, 7], "length", eos, 4)  # stopped early without EOS
    assert not termination_ok([5, EOS, 7, 8], "length", eos, 4)  # ran past an EOS
    assert not termination_ok([5, 6, 7, EOS], "length", eos, 4)  # an EOS is not a length stop
    assert not termination_ok([5, 6], "eos", eos, 4)  # claims an EOS that is not there
    assert not termination_ok([5, 6, 7, 8, EOS], "eos", eos, 4)  # beyond the cap
    assert not termination_ok([5, 6, EOS], "stop", eos, 4)  # no such reason
    # Any of several EOS ids ends a completion, and only the first may appear.
    two = frozenset({EOS, 100})
    assert termination_ok([5, 100], "eos", two, 4)
    assert not termination_ok([100, EOS], "eos", two, 4)


def test_bad_calls_are_refused(lm: CausalLM, prompts: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="seed"):
        _generate(lm, prompts, SEEDS[:2])
    with pytest.raises(ValueError, match="token"):
        _generate(lm, [[]], [1])
    with pytest.raises(ValueError, match="exceed"):
        _generate(lm, prompts, SEEDS, max_new_tokens=lm.context_len)
    assert _generate(lm, [], []) == []


def test_make_backend() -> None:
    backend = make_backend("hf", precision="fp16")
    assert isinstance(backend, HFBackend) and backend.name == "hf"
    assert backend.precision == "fp16"
    with pytest.raises(ValueError, match="unknown"):
        make_backend("torch")
