import pytest
from pydantic import ValidationError

from prime_swarm.libs.model.io import load_pretrained, weights_sha256
from prime_swarm.libs.rl.envs import get_env
from prime_swarm.libs.rl.evaluate import heldout_reward
from prime_swarm.libs.rl.sft import MARKER_FILE, warm_start


def test_warm_start_writes_hf_dir_and_is_cached(tmp_path):
    out = warm_start(0, tmp_path / "warm", seed=0, steps=3, batch_size=8)
    assert (out / MARKER_FILE).exists() and (out / "config.json").exists()
    digest, mtime = weights_sha256(out), (out / "model.safetensors").stat().st_mtime_ns
    warm_start(0, tmp_path / "warm", seed=0, steps=3, batch_size=8)
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not retrained
    warm_start(0, tmp_path / "warm", seed=0, steps=4, batch_size=8)
    assert weights_sha256(out) != digest  # other parameters: retrained


def test_heldout_reward_is_a_mean_in_unit_interval(tmp_path):
    model, tok = load_pretrained(warm_start(0, tmp_path / "w", seed=0, steps=2, batch_size=4))
    r = heldout_reward(model, tok, get_env("reverse"), n_tasks=16, seed=0)
    assert 0.0 <= r <= 1.0
    assert r == heldout_reward(model, tok, get_env("reverse"), n_tasks=16, seed=0)


def test_overrides_are_validated(tmp_path):
    with pytest.raises(ValidationError):
        warm_start(0, tmp_path / "w", seed=0, steps=1, error_rate=2.0)
    with pytest.raises(ValidationError):
        warm_start(0, tmp_path / "w", seed=0, steps=1, no_such_field=1)
