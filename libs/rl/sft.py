"""Warm start: a short, deliberately imperfect supervised run before RL.

The demonstrations come from a noisy teacher: only `correct_fraction` of them are right, the
rest are the env's typical mistake. The model learns the answer format and both behaviours, with
the wrong one as its greedy choice, so RL starts from a policy whose samples contain the better
answer often enough for GRPO to find and reinforce it.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.gpt import TinyGPT
from prime_swarm.libs.model.io import load_pretrained, save_pretrained, weights_sha256
from prime_swarm.libs.model.tokenizer import build_tokenizer, encode
from prime_swarm.libs.rl.defaults import WARM_START, WarmStartConfig
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.forward import forward_completions

MARKER_FILE = "warm_start.json"
# Bump when the recipe changes so cached warm starts from an older recipe are rebuilt.
RECIPE_VERSION = 1


def _base(base: str | Path | int) -> tuple[TinyGPT, dict[str, object]]:
    if isinstance(base, int):
        return init_tiny_model(base), {"base_seed": base}
    model, _ = load_pretrained(base)
    return model, {"base_weights_sha256": weights_sha256(base)}


def _marker_matches(out: Path, params: dict[str, object]) -> bool:
    try:
        return json.loads((out / MARKER_FILE).read_text()) == params
    except (OSError, ValueError):
        return False


def train_sft(model: TinyGPT, cfg: WarmStartConfig, seed: int) -> list[float]:
    """Cross-entropy on noisy-teacher demonstrations; returns the loss curve."""
    env = get_env(cfg.env)
    tok = build_tokenizer()
    eos = model.config.eos_token_id
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    losses = []
    model.train()
    for step in range(cfg.steps):
        tasks = env.sample_tasks(seed * 1_000_003 + step, cfg.batch_size, "train")
        pairs = []
        for t in tasks:
            answer = t.answer if rng.random() < cfg.correct_fraction else env.flawed_answer(t, rng)
            pairs.append((encode(tok, t.prompt, add_bos=True), [*encode(tok, answer), eos]))
        logits, _, targets, mask = forward_completions(model, pairs)
        loss = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def warm_start(
    base: str | Path | int,
    out_dir: str | Path,
    *,
    seed: int,
    cfg: WarmStartConfig = WARM_START,
    **overrides: object,
) -> Path:
    """Build (or reuse) the warm-started policy in `out_dir` as a Hugging Face model directory.

    `base` is a model directory or a seed for a fresh tiny model. Keyword overrides replace
    fields of `cfg` (e.g. steps=100). A completed run with identical parameters is reused.
    """
    cfg = cfg.model_copy(update=overrides)
    out = Path(out_dir)
    model, base_params = _base(base)
    params = {"recipe": RECIPE_VERSION, "seed": seed, **base_params, **cfg.model_dump()}
    if _marker_matches(out, params):
        return out
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        train_sft(model, cfg, seed)
    save_pretrained(model, build_tokenizer(), out)
    # Written last: a marker present means the model beside it is complete.
    tmp = out / f".{MARKER_FILE}.tmp"
    tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / MARKER_FILE)
    return out
