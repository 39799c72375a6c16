"""The wire bounds of libs/rollout/wire.py against the JSON the protocol really writes, at the
project's small shape and at a 7B pool's (groups of 16, 2,048-token completions)."""

from __future__ import annotations

import random

import pytest

from prime_swarm.libs.rollout import wire
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    CompletionSample,
    RolloutSubmission,
    SamplingParams,
    SubmissionBatch,
    Verdict,
    VerifiedCompletion,
    VerifiedRollout,
)

WORKER = "0x" + "ab" * 20
VOCAB = 152_064  # Qwen2-7B's


def _widest_logprob(rng: random.Random) -> float:
    return -rng.random() * 10 ** rng.randint(-6, 1)


def submission(rng: random.Random, group: int, tokens: int, prompt: int) -> RolloutSubmission:
    """Worst-ish honest content: ids over the whole vocabulary, log-probs of every magnitude,
    a proof of its real size over the completion."""
    completions = [
        CompletionSample(
            token_ids=[rng.randrange(VOCAB) for _ in range(tokens)],
            finish_reason="length",
            proof=rng.randbytes(wire.proof_bytes(tokens)),
            claimed_reward=rng.random(),
            logprobs=[_widest_logprob(rng) for _ in range(tokens)],
        )
        for _ in range(group)
    ]
    return RolloutSubmission(
        lease_id="l" * 32, worker=WORKER, pool_id=1, task_id="t" * 64, policy_version=12,
        device_class="cuda-sm90", prompt_token_ids=[rng.randrange(VOCAB) for _ in range(prompt)],
        completions=completions,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("group", "tokens", "batch"),
    [(8, 8, 8), (16, 2048, 4)],
    ids=["tiny", "7b-shape"],
)
def test_a_batch_fits_its_bound_and_the_bound_is_near_it(
    group: int, tokens: int, batch: int
) -> None:
    rng = random.Random(0)
    recipe = Recipe(group_size=group, max_new_tokens=tokens)
    subs = [submission(rng, group, tokens, prompt=512) for _ in range(batch)]
    body = SubmissionBatch(worker=WORKER, pool_id=1, submissions=subs).model_dump_json()
    assert len(body) <= wire.batch_body_bytes(recipe, batch)
    bound = batch * wire.submission_bytes(recipe)  # the cap without its floor
    # Prompts are counted at the protocol's cap (4,096 tokens) and ids at ten digits (a 152k
    # vocabulary writes six): past the prompts' slack the bound is within 1.6x of the body.
    prompts = batch * (wire.MAX_TOKENS - 512) * wire.TOKEN_ID_BYTES
    assert bound - prompts < 1.6 * len(body)


def test_a_7b_shaped_group_as_stream_entries() -> None:
    """rollouts:submitted's and rollouts:verified's entries of one group of 16 completions of
    2,048 tokens: under the entry bound, and their sizes as docs/capacity.md uses them."""
    rng = random.Random(1)
    recipe = Recipe(group_size=16, max_new_tokens=2048)
    sub = submission(rng, 16, 2048, prompt=512)
    submitted = len(streams.encode(sub)[streams.FIELD])
    verdict = Verdict(
        submission_id="s" * 32, lease_id="l" * 32, worker=WORKER, pool_id=1, accepted=True,
        units=16, validator=WORKER,
    )  # fmt: skip
    verified = VerifiedRollout(
        submission_id="s" * 32, worker=WORKER, env="reverse", task_id="t" * 64,
        policy_version=12, sampling=SamplingParams(temperature=1.0, max_new_tokens=2048),
        prompt_token_ids=sub.prompt_token_ids,
        completions=[
            VerifiedCompletion(
                token_ids=c.token_ids, logprobs=[_widest_logprob(rng) for _ in c.token_ids],
                inference_logprobs=c.logprobs, reward=1.0, task_reward=1.0,
            )
            for c in sub.completions
        ],
        verdict=verdict,
    )  # fmt: skip
    verified_bytes = len(streams.encode(verified)[streams.FIELD])
    assert max(submitted, verified_bytes) <= wire.entry_bytes(recipe)
    # Measured 2026-12-03 (docs/capacity.md R5): 1.28 MB and 1.64 MB.
    assert 1.1e6 < submitted < 1.5e6 and 1.4e6 < verified_bytes < 1.9e6


def test_the_orchestrator_body_cap_follows_the_recipe() -> None:
    from services.orchestrator.settings import OrchestratorSettings

    pool = {"ledger_address": "0x" + "00" * 20, "pool_id": 1}
    small = OrchestratorSettings(recipe=Recipe(), **pool)
    big = OrchestratorSettings(recipe=Recipe(group_size=16, max_new_tokens=2048), **pool)
    assert small.body_cap() == wire.batch_body_bytes(Recipe(), 64)
    assert big.body_cap() > 20 * small.body_cap()
    assert OrchestratorSettings(max_body_bytes=5000, **pool).body_cap() == 5000
