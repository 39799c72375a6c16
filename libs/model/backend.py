"""The generation backend interface: what a worker needs from an inference engine.

A backend samples with the pool's seeded Gumbel-max rule (libs/model/noise.py), so that a
validator can replay every choice, and returns the tokens with the log-probs it sampled them at.
A backend continues rows (`SampleRow`: the tokens so far and the noise key of the next one), so a
first turn and a later turn of a multi-turn episode are the same call; `generate` is the
first-turn case for a group per prompt.
Proofs are the rollout contract's (libs/rollout/answer.py proves over one prefill of the chosen
tokens, the recomputation a validator's second opinion runs). `hf` (transformers, KV cache, CPU
or CUDA) is in hf_backend.py, `vllm` (vLLM's V1 engine) in vllm_backend.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from prime_swarm.protocol.messages import BackendName

from .causal_lm import CausalLM

FinishReason = Literal["eos", "length"]


@dataclass
class Generation:
    """One sampled completion."""

    token_ids: list[int]
    finish_reason: FinishReason
    logprobs: list[float]
    """log softmax(logits / T) of each sampled token, as the generating machine computed it."""


@dataclass(frozen=True)
class SampleRow:
    """One sequence to continue: the tokens so far and the noise key of what comes next.

    The noise of the token at completion position k is keyed (seed, sample, k), where k counts
    every token after the prompt, the environment's too: a later turn continues at `offset`, so
    a validator replays all the turns of a branch from one prefill."""

    context: Sequence[int]
    """Every token before the first one to sample: the prompt, then any earlier turns."""
    seed: int
    sample: int
    """The completion's index in its group."""
    offset: int = 0
    """The completion position of the first token to sample (0 for a first turn)."""


class GenerationBackend(Protocol):
    name: str
    precision: str
    """The compute precision every generation runs in (declared with each submission)."""

    def generate_rows(
        self,
        lm: CausalLM,
        rows: Sequence[SampleRow],
        *,
        max_new_tokens: int,
        temperature: float,
    ) -> list[Generation]:
        """One generation per row, each stopping at its first EOS or at max_new_tokens;
        temperature 0 is greedy."""
        ...

    def generate(
        self,
        lm: CausalLM,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
    ) -> list[list[Generation]]:
        """`group_size` first turns per prompt (`GroupGeneration`)."""
        ...


class GroupGeneration:
    """`generate` for a backend that has `generate_rows`: the first-turn case, one group of
    completions per prompt."""

    def generate(
        self: GenerationBackend,
        lm: CausalLM,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
    ) -> list[list[Generation]]:
        """Completion j of prompt p is sampled with the noise of (seeds[p], j, position)."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        pairs = zip(prompts, seeds, strict=True)
        rows = [SampleRow(p, s, j) for p, s in pairs for j in range(group_size)]
        out = self.generate_rows(lm, rows, max_new_tokens=max_new_tokens, temperature=temperature)
        return [out[p * group_size : (p + 1) * group_size] for p in range(len(prompts))]


def check_request(lm: CausalLM, rows: Sequence[SampleRow], max_new_tokens: int) -> bool:
    """What every backend refuses before generating; False when there is nothing to do."""
    if not rows:
        return False
    if any(len(r.context) == 0 for r in rows):
        raise ValueError("every row needs at least one token of context")
    if max(len(r.context) for r in rows) + max_new_tokens > lm.context_len:
        raise ValueError(f"context + {max_new_tokens} new tokens exceed {lm.context_len}")
    return True


def make_backend(name: str, precision: str = "bf16") -> GenerationBackend:
    """The backend a worker runs, chosen once from its settings."""
    if name == "hf":
        from .hf_backend import HFBackend

        return HFBackend(precision)
    if name == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(precision)
    raise ValueError(
        f"unknown generation backend {name!r} (available: {', '.join(get_args(BackendName))})"
    )
