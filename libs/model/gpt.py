"""TinyGPT: a small pre-norm decoder-only transformer (nanoGPT-like) for tests and the local run.

`forward` returns the final hidden state next to the logits because TOPLOC proofs are computed
from exactly the tensor the LM head consumes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyGPTConfig:
    vocab_size: int
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 64
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError("n_embd must be divisible by n_head")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if attn_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        # Untied from wte: safetensors refuses shared storage and the vocabulary is tiny anyway.
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # biases and LayerNorm keep torch's defaults (zeros / ones)
            std = 0.02
            # GPT-2 scaling: keep the residual stream's variance independent of depth.
            if name.endswith("proj.weight"):
                std /= math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(p, mean=0.0, std=std)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (logits [B,T,V], hidden [B,T,C]); `hidden` is the post-ln_f input to lm_head.

        With `attention_mask` (1 = real token, 0 = padding) batches may be left- or right-padded:
        positions count real tokens only and padding is never attended to, so each row matches
        its unpadded forward. Outputs at padding positions are finite but meaningless.
        """
        B, T = input_ids.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        attn_mask = None
        if attention_mask is None:
            pos = torch.arange(T, device=input_ids.device).expand(B, T)
        else:
            real = attention_mask.to(torch.bool)
            pos = (real.long().cumsum(-1) - 1).clamp(min=0)
            causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
            allowed = causal & real[:, None, :]
            # A left-padding query would see no key at all (softmax over nothing is NaN), so
            # every position may see itself; real queries are unaffected.
            allowed |= torch.eye(T, dtype=torch.bool, device=input_ids.device)
            attn_mask = allowed[:, None, :, :]
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x, attn_mask)
        hidden = self.ln_f(x)
        return self.lm_head(hidden), hidden

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
