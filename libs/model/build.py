"""Build the project's own tiny base model from a seed (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

from prime_swarm.libs.model.gpt import TinyGPT, TinyGPTConfig
from prime_swarm.libs.model.io import save_pretrained
from prime_swarm.libs.model.tokenizer import BOS, EOS, PAD, build_tokenizer

# The size the RL defaults were tuned for (see libs/rl/defaults.py).
DEFAULT_ARCH = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 48}


def init_tiny_model(seed: int, **arch: int) -> TinyGPT:
    """A freshly initialised TinyGPT; identical weights for identical (seed, arch)."""
    tok = build_tokenizer()
    cfg = TinyGPTConfig(
        vocab_size=tok.get_vocab_size(),
        pad_token_id=tok.token_to_id(PAD),
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        **{**DEFAULT_ARCH, **arch},
    )
    # fork_rng keeps the caller's global RNG untouched by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyGPT(cfg)


def build_tiny_model(seed: int, out_dir: str | Path, **arch: int) -> Path:
    return save_pretrained(init_tiny_model(seed, **arch), build_tokenizer(), out_dir)
