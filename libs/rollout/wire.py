"""What answered leases weigh on the wire at most, from the pool's recipe: the body a worker's
batch of submissions may take, which the orchestrator reads no more than, and the stream entry
a submission becomes.

The bound is the JSON pydantic writes for the protocol's messages (protocol/messages.py) with
every field at its widest: token ids of up to ten digits, log-probs in `repr`'s longest form,
the TOPLOC proof's exact size (libs/toploc/codec.py) in base64, the spans at their cap. A
recipe's completions are its `max_new_tokens` long for a single-turn environment; a multi-turn
one is bounded only by the protocol's 4,096 tokens a completion. Prompts are bounded by the
protocol too (4,096 tokens), since the bound must hold for every task a pool may lease.
"""

from __future__ import annotations

import math

from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.toploc.codec import CHUNK_SIZE, HEADER_BYTES, TOPK

MAX_TOKENS = 4096
"""A prompt's and a completion's token cap (protocol/messages.py, RolloutSubmission)."""
TOKEN_ID_BYTES = 11  # up to 10 digits (ids < 2**31) and a comma
LOGPROB_BYTES = 25  # `-1.2345678901234567e-05` and a comma
SPAN_BYTES = 24  # `[4095,4096],`
MAX_SPANS = 64  # a completion's turns (protocol/messages.py)
COMPLETION_FIELDS = 256  # the field names, finish_reason, claimed_reward, brackets
SUBMISSION_FIELDS = 1024  # ids, addresses, version, backend, precision, device class
ENTRY_FIELDS = 4096  # what a stream entry adds: the lease, its sampling, times, the verdict
PROMPT_TEXT_BYTES = 8  # a prompt token's text as JSON, for the planning estimate only


def proof_bytes(tokens: int) -> int:
    """A TOPLOC proof's size over `tokens` rows: its header and one record a chunk (a
    modulus and at most TOPK coefficients, two bytes each)."""
    return HEADER_BYTES + math.ceil(tokens / CHUNK_SIZE) * (2 + 2 * TOPK)


def completion_bytes(tokens: int, turns: int = 1) -> int:
    """One completion of `tokens` tokens and `turns` model turns as JSON, at most: ids,
    log-probs, a span a turn and the proof in base64."""
    proof_b64 = 4 * math.ceil(proof_bytes(tokens) / 3)
    return (
        tokens * (TOKEN_ID_BYTES + LOGPROB_BYTES)
        + min(turns, MAX_SPANS) * SPAN_BYTES
        + proof_b64
        + COMPLETION_FIELDS
    )


def turns(recipe: Recipe) -> int:
    """The most model turns an episode of the recipe's environments takes."""
    return max(env.max_turns for env in recipe.environments().values())


def completion_tokens(recipe: Recipe) -> int:
    """The longest completion the recipe's environments produce."""
    return MAX_TOKENS if turns(recipe) > 1 else min(recipe.max_new_tokens, MAX_TOKENS)


def submission_bytes(recipe: Recipe) -> int:
    """One answered lease of the recipe as JSON, at most."""
    return (
        MAX_TOKENS * TOKEN_ID_BYTES
        + recipe.group_size * completion_bytes(completion_tokens(recipe), turns(recipe))
        + SUBMISSION_FIELDS
    )


MIN_BODY_BYTES = 1 << 20
"""The cap's floor: every other request of the protocol (a registration with its stack and 32
environment releases, a heartbeat, a lease request) is far below it."""


def batch_body_bytes(recipe: Recipe, submissions: int) -> int:
    """A signed batch of `submissions` answered leases, at most: the body cap that lets every
    honest batch in and nothing much larger (never under `MIN_BODY_BYTES`)."""
    return max(MIN_BODY_BYTES, submissions * submission_bytes(recipe) + SUBMISSION_FIELDS)


def entry_bytes(recipe: Recipe) -> int:
    """A group's largest stream entry, for planning Redis memory: rollouts:submitted carries
    the submission and its lease, rollouts:verified the tokens with two log-probs each (the
    validator's and the worker's) and no proof. The lease's prompt text is counted at
    `PROMPT_TEXT_BYTES` a token, an estimate: a prompt's text is the pool's own."""
    tokens = completion_tokens(recipe)
    verified = recipe.group_size * (
        tokens * (TOKEN_ID_BYTES + 2 * LOGPROB_BYTES)
        + min(turns(recipe), MAX_SPANS) * SPAN_BYTES
        + COMPLETION_FIELDS
    )
    prompt = MAX_TOKENS * (TOKEN_ID_BYTES + PROMPT_TEXT_BYTES)
    return max(submission_bytes(recipe), verified + prompt) + ENTRY_FIELDS
