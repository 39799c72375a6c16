"""Build the project's tiny base model from a seed (nothing is downloaded).

A real architecture (Qwen2: RoPE, RMSNorm, SwiGLU, grouped-query attention) at toy size, so every
code path that serves a 32B model runs on it. head_dim 32 is the smallest vLLM's CPU attention
accepts; hidden 128 with 4 query / 2 KV heads and 2 layers is about 362k parameters.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from .io import save_pretrained
from .tokenizer import build_tokenizer

TINY_ARCH: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # prompt (<= 12 tokens for the reversal task) + answer; RoPE needs no learned table anyway.
    "max_position_embeddings": 64,
}


def init_tiny_model(seed: int, **arch: int) -> Qwen2ForCausalLM:
    """A freshly initialised tiny Qwen2; identical weights for identical (seed, arch)."""
    tok = build_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        # Untied so the head can move apart from the byte embeddings during the short warm start.
        tie_word_embeddings=False,
        **{**TINY_ARCH, **arch},
    )
    # fork_rng keeps the caller's global RNG untouched by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


def build_tiny_model(seed: int, out_dir: str | Path, **arch: int) -> Path:
    return save_pretrained(init_tiny_model(seed, **arch), build_tokenizer(), out_dir)
