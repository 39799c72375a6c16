"""A loaded causal LM as every part of the system sees it: the final hidden states (what TOPLOC
commits to) and the sampling head over them, whatever the architecture.

The split matters: a proof commits to the tensor the LM head consumes, so generation, the
validator's prefill and the trainer all take the base model's `last_hidden_state` (after the
final norm) and apply the head themselves, in fp32.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

PRECISIONS: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def _head_transforms(config: object) -> float | None:
    """The final-logit soft cap a few architectures apply (Gemma 2), or None.

    Heads that rescale logits in other ways are refused rather than silently mis-sampled.
    """
    for name in ("logit_scale", "logits_scaling"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(f"{type(config).__name__}.{name}={value} is not supported")
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


@dataclass(eq=False)
class CausalLM:
    module: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: Path | None = None
    """The directory it was loaded from: engines that load weights themselves (vLLM) read it."""
    _casts: dict[torch.dtype, CausalLM] = field(default_factory=dict, repr=False)
    _head_fp32: tuple[tuple[int, int], torch.Tensor] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.softcap = _head_transforms(self.module.config)
        if self.module.get_output_embeddings() is None:
            raise ValueError(f"{type(self.module).__name__} has no LM head")

    # ------------------------------------------------------------------ facts
    @property
    def config(self) -> object:
        return self.module.config

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        """Rows of the head: the width of every logits vector (may exceed len(tokenizer))."""
        return int(self.module.get_output_embeddings().weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.module.get_output_embeddings().weight.shape[1])

    @property
    def context_len(self) -> int:
        cfg = self.module.config
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(cfg, name, None)
            if value:
                return int(value)
        return 1 << 20

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every id that ends a completion: the generation config's (an int or a list) and the
        tokenizer's EOS."""
        ids: set[int] = set()
        for source in (getattr(self.module, "generation_config", None), self.module.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        if not ids:
            raise ValueError("the model defines no EOS token")
        return frozenset(ids)

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(self.module.config, "pad_token_id", None)
        return int(pad) if pad is not None else min(self.eos_ids)

    # ------------------------------------------------------------------ compute
    def final_hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: object | None = None,
    ) -> torch.Tensor:
        """[B, T, C] hidden states after the final norm: what the LM head turns into logits."""
        out = self.module.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits from final hidden states (the pool's sampling head).

        fp32 so that logits, the Gumbel replay and log-probs do not add bf16 rounding (an ulp of
        a bf16 logit near 10 is 0.06) on top of the hidden states' own noise. The fp32 copy of a
        low-precision head is cached until the weights change.
        """
        head = self.module.get_output_embeddings()
        bias = head.bias.float() if getattr(head, "bias", None) is not None else None
        logits = torch.nn.functional.linear(hidden.float(), self.head_weight(), bias)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def head_weight(self) -> torch.Tensor:
        """[V, C] the LM head's weight in fp32: the parameter itself (the trainer's gradient flows
        through it), or a low-precision head's fp32 copy, cached until the weights change."""
        weight = self.module.get_output_embeddings().weight
        if weight.dtype == torch.float32:
            return weight
        key = (weight.data_ptr(), weight._version)
        if self._head_fp32 is None or self._head_fp32[0] != key:
            self._head_fp32 = (key, weight.detach().float())
        return self._head_fp32[1]

    def cast(self, precision: str) -> CausalLM:
        """This model computing in `precision`: itself, or a cached copy made now.

        The copy is a snapshot, meant for loaded (immutable) policies; a model being trained is
        never cast.
        """
        dtype = PRECISIONS[precision]
        if self.dtype == dtype:
            return self
        if dtype not in self._casts:
            # Parameters only, as `from_pretrained(dtype=...)` leaves the model: buffers such as
            # RoPE's inv_freq stay fp32. `module.to(dtype)` would round them too, turning every
            # rotation angle, and a worker that loaded in bf16 would disagree with a validator
            # that cast to bf16 by about an ulp on half the values. The memo hands deepcopy each
            # parameter already cast (tied ones stay tied: one entry per tensor), so the copy
            # never holds a second full-precision model on the way.
            memo: dict[int, object] = {
                id(p): torch.nn.Parameter(p.data.to(dtype), requires_grad=p.requires_grad)
                for p in self.module.parameters()
            }
            module = copy.deepcopy(self.module, memo).eval()
            self._casts[dtype] = CausalLM(module, self.tokenizer, self.source)
        return self._casts[dtype]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())
