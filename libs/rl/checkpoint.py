"""The trainer's checkpoints: one directory per version, written whole or not at all.

    <root>/v<N>/model/              the HF model directory of the master weights (resume, eval)
    <root>/v<N>/published/          the same in the published precision, when that differs:
                                    what is shipped as version N (else model/ is)
    <root>/v<N>/trainer_state.pt    optimizer, scheduler, RNG, step, the submissions trained

Everything of a version is written into a hidden sibling and renamed into place, so a kill -9 at
any instant leaves either the previous complete checkpoint or the new complete one. The trained
submission ids travel inside the same unit as the weights they produced: that is what lets a
resumed trainer skip exactly what it already learned from (DESIGN.md §2, nothing twice).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from prime_swarm.libs.model.io import once_per_tensor

STATE_FILE = "trainer_state.pt"
MODEL_DIR = "model"
PUBLISHED_DIR = "published"


@dataclass
class TrainerState:
    step: int
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    rng: dict[str, Any] = field(default_factory=dict)
    trained: list[str] = field(default_factory=list)
    """Submission ids whose gradient is in this version (and was not in the one before)."""
    counters: dict[str, float] = field(default_factory=dict)
    """Running totals the progress log continues from (filtered, stale, busy seconds...)."""


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version}"


def model_dir(root: Path, version: int) -> Path:
    return version_dir(root, version) / MODEL_DIR


def published_dir(root: Path, version: int) -> Path:
    """The model directory shipped as `version`: the published-precision copy if one was
    written, else the master weights."""
    published = version_dir(root, version) / PUBLISHED_DIR
    return published if published.is_dir() else model_dir(root, version)


def saved_versions(root: Path) -> list[int]:
    """Complete checkpoints, oldest first (hidden temp dirs of a crashed save are not listed)."""
    if not root.exists():
        return []
    return sorted(
        int(p.name[1:])
        for p in root.iterdir()
        if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit() and (p / MODEL_DIR).is_dir()
    )


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    module: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: TrainerState,
    weights: dict[str, torch.Tensor] | None = None,
    publish_dtype: torch.dtype | None = None,
) -> Path:
    """Write version `state.step` atomically; `weights` (a detached snapshot) replaces the
    module's live parameters, so a background thread can save while the next step trains.
    With `publish_dtype` other than the weights' own, a copy of the model in that dtype is
    written beside them for publishing (`published_dir`)."""
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, state.step)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{state.step}.tmp-", dir=root))
    try:
        os.chmod(tmp, 0o755)
        master = weights if weights is not None else module.state_dict()
        cast = None
        if publish_dtype is not None and any(
            t.is_floating_point() and t.dtype != publish_dtype for t in master.values()
        ):
            # One cast per tensor, not per name: tied weights (SmolLM2's head is its embedding)
            # must stay one tensor, or the published file carries the embedding twice
            # (325.7 MB instead of 269.1 MB, and a delta that ships each change twice).
            to_dtype = once_per_tensor(lambda t: t.to(publish_dtype))
            cast = {k: to_dtype(t) if t.is_floating_point() else t for k, t in master.items()}
        # save_pretrained empties the state dict it is handed: each call gets its own.
        module.save_pretrained(tmp / MODEL_DIR, state_dict=dict(master), safe_serialization=True)
        tokenizer.save_pretrained(tmp / MODEL_DIR)
        if cast is not None:
            # The same config and tokenizer files as model/: a client's fast reload path
            # (libs/model/io.load_weights_like) only needs the weights to change.
            module.save_pretrained(tmp / PUBLISHED_DIR, state_dict=cast, safe_serialization=True)
            tokenizer.save_pretrained(tmp / PUBLISHED_DIR)
        torch.save(state.__dict__, tmp / STATE_FILE)
        _fsync_tree(tmp)
        if final.exists():  # a crash after this rename's predecessor: replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_state(root: Path, version: int) -> TrainerState | None:
    path = version_dir(root, version) / STATE_FILE
    if not path.exists():
        return None
    # weights_only: a checkpoint is data; refusing pickled code costs nothing here.
    raw = torch.load(path, map_location="cpu", weights_only=True)
    return TrainerState(**raw)


def prune(root: Path, keep: int, protect: frozenset[int] = frozenset({0})) -> None:
    """Delete all but the newest `keep` versions (v0, the start of RL, is kept)."""
    versions = saved_versions(root)
    for v in versions[: max(len(versions) - keep, 0)]:
        if v not in protect:
            shutil.rmtree(version_dir(root, v), ignore_errors=True)
    for stale in root.glob(".v*.tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
