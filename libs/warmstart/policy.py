"""The warm-started policy as a Hugging Face model directory, built once per parameters and
reused after (a marker file beside the weights names them)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.io import load_pretrained, save_pretrained, weights_sha256
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl.defaults import WARM_START, WarmStartConfig
from prime_swarm.libs.rl.sft import Progress, train_sft
from prime_swarm.libs.rollout.demonstrations import demonstration_batches

MARKER_FILE = "warm_start.json"
# Bump when the recipe changes so cached warm starts from an older recipe are rebuilt.
RECIPE_VERSION = 4


def _base(base: str | Path | int) -> tuple[CausalLM, dict[str, object]]:
    if isinstance(base, int):
        return CausalLM(init_tiny_model(base), build_tokenizer()), {"base_seed": base}
    return load_pretrained(base), {"base_weights_sha256": weights_sha256(base)}


def _marker_matches(out: Path, params: dict[str, object]) -> bool:
    try:
        return json.loads((out / MARKER_FILE).read_text()) == params
    except (OSError, ValueError):
        return False


def _train(model: CausalLM, cfg: WarmStartConfig, seed: int, progress: Progress | None) -> None:
    shares = cfg.mixture or [{"env": cfg.env, "args": cfg.env_args, "weight": 1.0}]
    envs = [(load_env(x["env"], x.get("args")), float(x.get("weight", 1.0))) for x in shares]
    batches = demonstration_batches(
        envs, model, seed=seed, batch_size=cfg.batch_size, error_rate=cfg.error_rate
    )
    train_sft(model, batches, steps=cfg.steps, lr=cfg.lr, progress=progress)


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    # Several services may start at once and ask for the same warm start: one trains, the
    # others wait and then find the marker.
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def warm_start(
    base: str | Path | int,
    out_dir: str | Path,
    *,
    seed: int,
    steps: int | None = None,
    cfg: WarmStartConfig = WARM_START,
    progress: Progress | None = None,
    **overrides: object,
) -> Path:
    """Build (or reuse) the warm-started policy in `out_dir` as a Hugging Face model directory.

    `base` is a model directory or a seed for a fresh tiny model. `steps` and the keyword
    overrides replace fields of `cfg` (e.g. error_rate=0.5), validated. A completed run with
    identical parameters (marker file) is reused without training.
    """
    if steps is not None:
        overrides["steps"] = steps
    cfg = WarmStartConfig.model_validate({**cfg.model_dump(), **overrides})
    out = Path(out_dir)
    model, base_params = _base(base)
    # An empty mixture is left out, so warm starts cached before mixtures existed still match.
    trained_on = cfg.model_dump(exclude={"mixture"} if not cfg.mixture else set())
    params = {"recipe": RECIPE_VERSION, "seed": seed, **base_params, **trained_on}
    with _exclusive(out):
        if _marker_matches(out, params):
            return out
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            _train(model, cfg, seed, progress)
        save_pretrained(model, model.tokenizer, out)
        # Written last: a marker present means the model beside it is complete.
        tmp = out / f".{MARKER_FILE}.tmp"
        tmp.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out / MARKER_FILE)
    return out
