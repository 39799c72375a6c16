"""Acceptance limits, calibrated on measured honest noise and measured cheats (DESIGN.md §3.10).

Every statistic is measured against the validator's fp32 reference (libs/rollout/recompute.py),
so the limits do not depend on the validator's engine or device, and they are one set for every
precision and device: a worker that lies about them gains no looser limit. The one difference by
prover engine is the sampling replay of vLLM work, whose kernels the validator does not run
(`acceptance_for`): a worker declaring vLLM gains that, and only that.

Three outcomes per statistic (a `Band`): at most `accept_at_most` is honest; from `reject_from`
on it is a cheat, rejected and slashed; in between the group is a suspect, neither trained on
nor slashed until the second opinion (`Recheck`: the validator's own recomputation in the
declared precision, the path the worker took) settles it. The bands are set between the honest
worst and the weakest cheat measured by `make bench-toploc` (bench/results/toploc.json, section
`models`: every model, depth and prover/validator pair, with the margins it printed); rerun it
for a new model, engine or device class:

    .venv/bin/python -m bench.toploc.models --model DIR   # prints each statistic's margins
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prime_swarm.libs.toploc import Thresholds


class Band(BaseModel):
    """Accept at or below `accept_at_most`, reject at or above `reject_from`, suspect between."""

    model_config = ConfigDict(frozen=True)

    accept_at_most: float = Field(ge=0)
    reject_from: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Band:
        if self.reject_from < self.accept_at_most:
            raise ValueError("reject_from must not be below accept_at_most")
        return self

    def outcome(self, value: float) -> str:
        """ "accept", "suspect" or "reject" (NaN is a reject: no honest statistic is NaN)."""
        if value <= self.accept_at_most:
            return "accept"
        if value < self.reject_from:
            return "suspect"
        return "reject"


class Recheck(BaseModel):
    """The second opinion's limits: the validator recomputes the way the worker declared it
    computed (precision, KV-cached decode), where honest work on the same device class agrees
    almost exactly."""

    model_config = ConfigDict(frozen=True)

    max_group_mant_err: float = Field(
        gt=0,
        description="Largest pooled mantissa error (ulps) of the proofs against the validator's "
        "prefill in the declared precision.",
    )
    max_replay_gap: float = Field(
        ge=0,
        description="Largest replay gap (tempered-logit units) against a KV-cached decode of the "
        "claimed tokens in the declared precision.",
    )
    max_replay_z: float = Field(
        gt=0,
        description="Largest replay gap against that decode in units of the honest noise at its "
        "position (verify.replay_z).",
    )


class Acceptance(BaseModel):
    model_config = ConfigDict(frozen=True)

    gross: Thresholds = Field(
        description="Per-chunk TOPLOC limits against the fp32 reference: gross mismatches only "
        "(a proof of other tokens, states or a broken proof)."
    )
    weight_ratio: Band = Field(
        description="The group's pooled proof error against the reference divided by the "
        "validator's own honest error in the declared precision (same points): about 1 for "
        "honest work at any depth, 2.2+ for int8 weights or a 1 %-RMS neighbour."
    )
    noise_floor_ulp: float = Field(
        gt=0,
        description="Smallest noise scale the ratio divides by: an fp32 worker's honest error is "
        "about 0, and a bf16 worker declaring fp32 must not divide by 0.",
    )
    replay_z: Band = Field(
        description="Largest replay gap in the group in units of the honest noise at its "
        "position (verify.replay_z): a near-tie that rounding can flip scores a few, a token "
        "the seeded noise did not choose tens and more."
    )
    replay_z_own_class: Band | None = Field(
        None,
        description="The replay band where the worker declared the validator's device class "
        "and this engine's numerics are the validator's own (hf): there honest noise is only "
        "the validator's own rounding, so near-tie cheats that the cross-class band must let "
        "through stand out. None: the same as `replay_z` (an engine with kernels of its own).",
    )
    max_replay_gap: float = Field(
        gt=0,
        description="Tempered-logit units: a submitted token that trails the seeded choice "
        "under the reference logits by this much is rejected whatever the noise estimate.",
    )
    replay_noise_floor: float = Field(
        gt=0,
        description="Smallest noise scale (tempered-logit units) a replay gap is divided by.",
    )
    recheck: Recheck


ACCEPTANCE = Acceptance(
    # TOPLOC's published per-chunk limits (38 of 128 exponent mismatches, mantissa error mean 10
    # and median 8), plus 8 sign flips: they survive cross-device noise at depth and only catch
    # gross forgeries; the weight ratio below tells near weights apart.
    gross=Thresholds(),
    # bench/toploc/models.py (bench/results/toploc.json `models`, 2026-11-25, this CPU):
    # honest groups judged by a validator of their own class sit at 0.95-1.18 on every model
    # (SmolLM2 0.98-1.01); judged across classes (eager attention, the emulated GPU) they spread
    # more on short groups (2-layer tiny model 0.36-2.73, depth 2 0.83-1.09, SmolLM2 0.87-1.05),
    # which is why a reject from another class only makes a suspect (verify.judge_group). The
    # weakest weight cheats: int8 1.89 and a 1 %-RMS neighbour 2.59 at depth 2, but int8 from 0.58
    # on the tiny model, where only the same-class comparison (`recheck`) tells it apart. Between
    # 1.5 and 2.5 a group is a suspect for the second opinion.
    weight_ratio=Band(accept_at_most=1.5, reject_from=2.5),
    # 0.05 let two small numbers make a large ratio: honest fp16 groups of the 2-layer model
    # reached 2.36 (fp16 rounds 8x finer than bf16, so both its errors are a few hundredths of a
    # bf16 ulp). bf16's own noise is 0.3 ulp and more at every depth measured, so 0.1 binds only
    # for fp16 and fp32, where a bf16 worker declaring fp32 still lands at 3x and more.
    noise_floor_ulp=0.1,
    # The sampling replay (bench/toploc/models.py, `margins.replay`, 2026-11-25, this CPU).
    # Honest flips are near-ties inside the noise at their position: z at most 5.0 (tiny, own
    # class), 14.9 (tiny, emulated GPU), 2.2 (depth 2), under 1 on SmolLM2, whose 576-wide
    # hidden state the isotropic estimate overstates. Sampling that ignores the seed: z 269 and
    # more on the tiny model, 2,866 and more at depth 2. An absolute limit could not tell them
    # apart: on the tiny model's peaked distributions a seed-ignoring cheat flipped only tokens
    # 0.37 apart while honest noise reached 0.48 elsewhere (the former band, accept up to 1.0,
    # let 2 of 10 through). Between the bands a group is a suspect for the second opinion.
    replay_z=Band(accept_at_most=20.0, reject_from=80.0),
    # The validator's own path (transformers, its device class): honest multi-turn hf groups
    # judged on their own class reached z 1.75 in 500 groups (bench/toploc/multi_turn.py,
    # 2026-11-26) and 0.0 in 240 more; single-turn on the tiny model 5.0 (models.py). One
    # turn sampled with another seed that differed only at a near-tie reached only 8.3 (1 in 110
    # trials; the rest 122 and more): inside the cross-class band, outside this one.
    replay_z_own_class=Band(accept_at_most=6.0, reject_from=80.0),
    # Honest worst absolute gap 0.48 (tiny), 0.45 (SmolLM2, emulated GPU); a tampered token
    # trails by 4.3 and more, sampling with another seed by up to 11: from 6 it is rejected
    # whatever the noise estimate says.
    max_replay_gap=6.0,
    replay_noise_floor=1e-3,
    # Honest work on the validator's own class agrees bit for bit (same-class error 0.0 in every
    # honest group; the proof prefill forwards each sequence alone). int8 sits at 0.73-1.42 ulp
    # (tiny, depth 2), a 0.3 %-RMS neighbour at 0.67 and more: 0.3 leaves room both ways.
    # The replay against the worker's own path (a bf16 KV-cached decode) is 0.0 on every honest
    # hf group measured (240 multi-turn groups); the near-tie cheat above keeps its 8.3 there.
    # For work from another class the decode is not the worker's path: a suspect from there
    # that fails it is held for a validator of that class, never slashed (verify.settle).
    recheck=Recheck(max_group_mant_err=0.3, max_replay_gap=0.5, max_replay_z=6.0),
)

# vLLM's CPU kernels round otherwise than the validator's transformers path even on the same
# device class, and the second opinion's decode is transformers': honest vLLM flips reached z
# 24.8 in 500 multi-turn groups (p99 9.7; bench/toploc/multi_turn.py, 2026-11-26), and the
# decode's z tracks the first opinion's (3.9 -> 5.3, 2.7 -> 2.7). Its own-class band is the
# cross-class one and its recheck allows twice the worst honest flip; every proof limit is
# shared. Found there: a near-tie cheat (z 8.3) declared as vLLM work would pass. Seed-ignoring
# cheats score 122 and more on the first opinion, which stays a slash from 80 on.
VLLM_RECHECK_REPLAY_Z = 50.0

ENGINES = ("hf", "vllm")


def acceptance_for(backend: str) -> Acceptance | None:
    """The limits for work from prover engine `backend`, or None for an engine never measured.
    Read from `ACCEPTANCE` at each call (tests narrow or widen it)."""
    if backend not in ENGINES:
        return None
    if backend != "vllm":
        return ACCEPTANCE
    recheck = ACCEPTANCE.recheck.model_copy(update={"max_replay_z": VLLM_RECHECK_REPLAY_Z})
    return ACCEPTANCE.model_copy(update={"replay_z_own_class": None, "recheck": recheck})
