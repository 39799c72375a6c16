"""The torch generation backend: seeded Gumbel-max decoding at the pool's precision, with the
final hidden states captured during generation (no second prefill for TOPLOC)."""

from __future__ import annotations

from collections.abc import Sequence

from prime_swarm.libs.model.gpt import TinyGPT
from prime_swarm.libs.rl.sampling import CapturedCompletion, generate_captured

POOL_PRECISION = "bf16"


class TorchBackend:
    name = "torch"

    def __init__(self, precision: str = POOL_PRECISION) -> None:
        self.precision = precision

    def generate(
        self,
        model: TinyGPT,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        eos_id: int,
    ) -> list[list[CapturedCompletion]]:
        return generate_captured(
            model,
            prompts,
            seeds,
            group_size=group_size,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            eos_id=eos_id,
            precision=self.precision,
        )
