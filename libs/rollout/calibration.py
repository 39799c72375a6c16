"""Acceptance limits per prover engine, calibrated on measured honest noise (DESIGN.md §3.10).

Honest recomputation is never bit-exact: the worker decodes with a KV cache in batches of its
own choosing, the validator prefills whole sequences in other batches, kernels block reductions
by shape and thread count. Each limit below is the worst value `make bench-toploc` measured over
honest rollouts of that engine against the `hf` validator (bench/results/toploc.json, `honest`
and `precision_variants`), times a safety factor, and the same run shows every attack beyond it.

The honest worst case grows with model depth: a pool serving a deeper model re-runs
`bench/toploc_bench.py --model DIR` and sets the limits from its output.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prime_swarm.libs.toploc import Thresholds

from .recipe import Precision


class Acceptance(BaseModel):
    model_config = ConfigDict(frozen=True)

    reference_precision: Precision = Field(
        description="Precision the validator recomputes in. fp32, the most exact reference: every "
        "honest worker's deviation is then its own rounding noise (largest for bf16, the least "
        "precise compute a pool admits), and a quantized worker's error adds on top of it. "
        "Against a bf16 reference an fp32 worker and an int8 worker look alike."
    )
    thresholds: Thresholds = Field(description="Per-chunk TOPLOC limits.")
    replay_tolerance: float = Field(
        ge=0,
        description="Largest shortfall (tempered-logit units) of a submitted token's perturbed "
        "score below the best one: honest near-ties between decode and prefill logits.",
    )


ACCEPTANCE: dict[str, Acceptance] = {
    "hf": Acceptance(
        reference_precision="fp32",
        # 1000 honest rollouts (8000 completions, fp32 reference, bench/results/toploc.json): the
        # worst chunk had 8 exponent mismatches, 1 sign flip, mantissa mean 2.13 / median 1.0
        # ulp; the replay gap is 0 at the median and 0.004 at p99, but bf16 rounding flips a
        # near-tie now and then (worst 0.85 in 49k tokens), so the replay limit sits above that
        # tail, still below the O(1) gaps of tokens the seeded noise did not choose. A live
        # `make up` run showed honest chunks up to mantissa mean 3.78 on RL-trained versions
        # (the bench calibrates on the warm start), hence the mantissa limits' extra headroom.
        thresholds=Thresholds(
            max_exp_mismatches=12,
            max_sign_mismatches=4,
            max_mant_err_mean=6.0,
            max_mant_err_median=3.0,
        ),
        replay_tolerance=1.5,
    ),
}


def acceptance_for(backend: str) -> Acceptance | None:
    """The limits for proofs from `backend`, or None when no honest run calibrated them."""
    return ACCEPTANCE.get(backend)
