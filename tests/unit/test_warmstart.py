"""Warm start (libs/warmstart): a short SFT run written as a Hugging Face model directory,
cached by its parameters, and the held-out evaluation of such a policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.io import load_pretrained, weights_sha256
from prime_swarm.libs.rollout.evaluate import heldout_reward
from prime_swarm.libs.warmstart import MARKER_FILE, warm_start


def test_warm_start_writes_hf_dir_reports_progress_and_is_cached(tmp_path: Path) -> None:
    calls: list[tuple[int, int, float]] = []

    def progress(step: int, total: int, loss: float) -> None:
        calls.append((step, total, loss))

    out = warm_start(0, tmp_path / "warm", seed=0, steps=3, batch_size=8, progress=progress)
    assert out == tmp_path / "warm"
    assert (out / MARKER_FILE).exists() and (out / "config.json").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["steps"] == 3 and marker["batch_size"] == 8 and marker["base_seed"] == 0
    # The last step always reports, whatever the logging interval.
    assert [(s, t) for s, t, _ in calls] == [(3, 3)]
    assert math.isfinite(calls[0][2]) and calls[0][2] > 0.0
    digest, mtime = weights_sha256(out), (out / "model.safetensors").stat().st_mtime_ns

    calls.clear()
    warm_start(0, tmp_path / "warm", seed=0, steps=3, batch_size=8, progress=progress)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not retrained
    assert calls == []  # nothing trained, nothing reported

    warm_start(0, tmp_path / "warm", seed=0, steps=4, batch_size=8, progress=progress)
    assert weights_sha256(out) != digest  # other parameters: retrained
    assert [(s, t) for s, t, _ in calls] == [(4, 4)]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["warm"]


def test_warm_start_is_deterministic_and_accepts_a_model_dir(tmp_path: Path) -> None:
    a = warm_start(0, tmp_path / "a", seed=1, steps=2, batch_size=4)
    b = warm_start(0, tmp_path / "b", seed=1, steps=2, batch_size=4)
    assert weights_sha256(a) == weights_sha256(b)
    # The same base given as a directory trains to the same weights; its marker names the
    # base by its weights' hash.
    base = build_tiny_model(0, tmp_path / "base")
    c = warm_start(base, tmp_path / "c", seed=1, steps=2, batch_size=4)
    assert weights_sha256(c) == weights_sha256(a)
    marker = json.loads((c / MARKER_FILE).read_text())
    assert marker["base_weights_sha256"] == weights_sha256(base)


def test_heldout_reward_is_a_deterministic_mean_in_unit_interval(tmp_path: Path) -> None:
    lm = load_pretrained(warm_start(0, tmp_path / "w", seed=0, steps=2, batch_size=4))
    env = load_env("reverse")
    r = heldout_reward(lm, env, n_tasks=16, seed=0)
    assert 0.0 <= r <= 1.0
    # Greedy decoding: the same tasks give the same mean.
    assert r == heldout_reward(lm, env, n_tasks=16, seed=0)


def test_overrides_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        warm_start(0, tmp_path / "w", seed=0, steps=1, error_rate=2.0)
    with pytest.raises(ValidationError):
        warm_start(0, tmp_path / "w", seed=0, steps=1, no_such_field=1)
    assert not (tmp_path / "w").exists()  # refused before anything was written
