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


class Acceptance(BaseModel):
    model_config = ConfigDict(frozen=True)

    thresholds: Thresholds = Field(description="Per-chunk TOPLOC limits.")
    replay_tolerance: float = Field(
        ge=0,
        description="Largest shortfall (tempered-logit units) of a submitted token's perturbed "
        "score below the best one: honest near-ties between decode and prefill logits.",
    )


ACCEPTANCE: dict[str, Acceptance] = {
    "hf": Acceptance(
        thresholds=Thresholds(
            max_exp_mismatches=38,
            max_sign_mismatches=8,
            max_mant_err_mean=10.0,
            max_mant_err_median=8.0,
        ),
        replay_tolerance=0.05,
    ),
}


def acceptance_for(backend: str) -> Acceptance | None:
    """The limits for proofs from `backend`, or None when no honest run calibrated them."""
    return ACCEPTANCE.get(backend)
