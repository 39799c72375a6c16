"""The `deltas` section of `make bench-wan`: what a SmolLM2 version costs on the wire as a delta,
over real RL steps of the network (the `--model smollm2` pool of `make up`, on loopback: the
bytes do not depend on where the pool runs).

Each published version (bf16, what workers load) is copied aside as the run makes it; then each
is encoded against its parent with the codec the trainer ships (libs/shardcast/delta.py), and
rebuilt and compared byte for byte. `delta_bytes_ratio` is the mean delta over the full file
(the bytes a run ships per version), beside the largest (`max_bytes_ratio`: the first step's)
and the largest after the first.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.rl.checkpoint import PUBLISHED_DIR, version_dir
from prime_swarm.libs.shardcast import delta

from .delivery import log

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
WEIGHTS = "model.safetensors"


def collect(work: Path, steps: int) -> tuple[list[Path], LocalNetworkSettings]:
    """Run the SmolLM2 pool for `steps` steps; the published weights of versions 0..steps."""
    s = LocalNetworkSettings(
        model="smollm2", steps=steps, runs_dir=work / "runs", cache_dir=ROOT / ".cache",
        quiet=True,
    )  # fmt: skip
    run_dir = work / "run"
    run_dir.mkdir(parents=True)
    # Kept after the run (.cache/wan/smollm2-steps): a codec can be tried on real steps offline.
    kept = ROOT / ".cache" / "wan" / "smollm2-steps"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    net = LocalNetwork(s, prepare_model(s, say=lambda _m: None), run_dir)
    ckpts = run_dir / "checkpoints"

    def keep(version: int) -> None:
        # Copied once its checkpoint is in place (a step is reported before it is saved, and
        # the checkpoint is renamed into place whole) and before the trainer prunes it.
        published = version_dir(ckpts, version) / PUBLISHED_DIR / WEIGHTS
        deadline = time.monotonic() + 300
        while not published.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {version} was never checkpointed")
            time.sleep(0.2)
        shutil.copy(published, kept / f"v{version}.safetensors")

    try:
        net.start()
        keep(0)

        def on_step(row: Any) -> None:
            log(f"  deltas: step {row.step} reward {row.mean_reward:.3f}")
            keep(row.step)

        net.follow(on_step, s.timeout_s)
    finally:
        net.stop()
    return sorted(kept.glob("v*.safetensors"), key=lambda p: int(p.stem[1:])), s


def measure(versions: list[Path]) -> dict[str, Any]:
    rows = []
    for parent, new in zip(versions, versions[1:], strict=False):
        old_b, new_b = parent.read_bytes(), new.read_bytes()
        started = time.perf_counter()
        d = delta.encode(old_b, new_b)
        encode_s = time.perf_counter() - started
        assert d is not None
        started = time.perf_counter()
        assert delta.apply(old_b, d) == new_b  # lossless, byte for byte
        apply_s = time.perf_counter() - started
        old_w, new_w = np.frombuffer(old_b, "<u2"), np.frombuffer(new_b, "<u2")
        rows.append(
            {
                "version": int(new.stem[1:]),
                "full_bytes": len(new_b),
                "delta_bytes": len(d),
                "bytes_ratio": round(len(d) / len(new_b), 5),
                "changed_word_share": round(float(np.mean(old_w != new_w)), 5),
                "encode_s": round(encode_s, 2),
                "apply_s": round(apply_s, 2),
            }
        )
    ratios = [r["bytes_ratio"] for r in rows]
    return {
        # Bytes a run ships per version, over the file: what a delta costs the wide area.
        "delta_bytes_ratio": round(sum(ratios) / len(ratios), 5),
        "max_bytes_ratio": max(ratios),
        # After the first step: Adam's first update moves every weight with a gradient by the
        # whole learning rate (its normalised update is the gradient's sign), later ones less.
        "after_first_max_bytes_ratio": max(ratios[1:], default=None),
        "codec": delta.MAGIC.decode(),
        "per_version": rows,
    }


def run(work: Path, steps: int = STEPS) -> dict[str, Any]:
    versions, s = collect(work, steps)
    out = measure(versions)
    out["config"] = {"model": "smollm2", "steps": steps, "lr": s.lr,
                     "publish_precision": s.publish_precision}  # fmt: skip
    return out
