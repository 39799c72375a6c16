"""The generation backend interface: what a worker needs from an inference engine.

A backend samples with the pool's seeded Gumbel-max rule (libs/model/noise.py), so that a
validator can replay every choice, and returns the tokens with the log-probs it sampled them at.
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


class GenerationBackend(Protocol):
    name: str
    precision: str
    """The compute precision every generation runs in (declared with each submission)."""

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
        """`group_size` completions per prompt; completion j of prompt p is sampled with the
        noise of (seeds[p], j, position) and stops at its first EOS or at max_new_tokens.
        temperature 0 is greedy."""
        ...


def check_request(
    lm: CausalLM,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    max_new_tokens: int,
) -> bool:
    """What every backend refuses before generating; False when there is nothing to do."""
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    if not prompts:
        return False
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max(len(p) for p in prompts) + max_new_tokens > lm.context_len:
        raise ValueError(f"prompt + {max_new_tokens} new tokens exceed {lm.context_len}")
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
