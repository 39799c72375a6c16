"""`make bench-weights`: every stage of a policy version's weight path on this machine, in bytes
per second per core against the machine's own floor (its sha256 and copy speed, measured in the
same run), with peak memory against the version's largest file; bench/results/weights.json.

    .venv/bin/python -m bench.weights [--sizes smollm2,1.5b,7b] [--keep]

The versions are made afresh each run and removed after it (30 GB at 7B) unless --keep.

Sizes: SmolLM2-135M-Instruct and Qwen2's 1.5B and 7B shapes (bench/weights/shapes.py says how
their weights and their next version are made). Each stage runs as a process of its own
(bench/weights/stage.py), so its CPU time (every thread's, user and system) and its peak
resident memory (VmHWM) are its own. `bytes_per_s_per_core` is the stage's bytes over its CPU
seconds: what one core of this machine does of it. The floor is the slower of one core's sha256
and plain copy of the largest file (each the best of three runs); `floor_ratio` is a stage's
rate over it (goal: at least 0.5), `peak_rss_ratio` its peak memory over the largest file
(goal: at most 1.25).

Not timed here yet: the transfers (upload to the origin, a relay's pull, a follower's fetch),
which bench/wan times over a wide-area testbed at SmolLM2's size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.toploc.results_file import write_results
from bench.weights import shapes
from prime_swarm.libs.shardcast import delta

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
OUT = REPO / "bench" / "results" / "weights.json"
FLOORS = ("sha256", "copy")
# In path order: the trainer's publish (hash, sign, delta encode), then a follower's rebuild
# from its held parent (patch, hash against the signed file hash, write), the audit's
# whole-file re-hash, and the rename into place.
STAGES = ("hash_version", "sign", "encode", "rebuild", "verify", "install")
GOAL_FLOOR_RATIO, GOAL_PEAK_RSS_RATIO = 0.5, 1.25


def run_stage(name: str, cfg: dict) -> dict:
    """The stage in a process of its own: its bytes, wall and CPU seconds, peak memory."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.weights.stage", name, json.dumps(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"stage {name} failed:\n{done.stderr[-2000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    wall, cpu = row["wall_s"], row["cpu_s"]
    return {
        "bytes": row["bytes"],
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cores_used": round(cpu / max(wall, 1e-9), 2),
        "bytes_per_s_per_core": round(row["bytes"] / max(cpu, 1e-9)),
        "peak_rss_bytes": row["peak_rss"],
    }


def measure(size: str, keep: bool) -> dict:
    t0 = time.perf_counter()
    # Made in a process of its own: the versions' arrays never enter this one, whose memory
    # every stage's process would otherwise start from.
    make = (
        "from pathlib import Path; from bench.weights.shapes import versions; "
        f"versions({size!r}, Path({str(CACHE)!r}))"
    )
    subprocess.run([sys.executable, "-c", make], cwd=REPO, check=True)
    v1, v2 = (CACHE / "weights" / size / v for v in ("v1", "v2"))
    made_s = time.perf_counter() - t0
    files = sorted(v2.glob("*.safetensors"))
    largest = max(f.stat().st_size for f in files)
    version_bytes = sum(f.stat().st_size for f in files)
    scratch = CACHE / "weights" / f"{size}-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    cfg = {"v1": str(v1), "v2": str(v2), "scratch": str(scratch)}
    try:
        run_stage("hash_parent", cfg)  # what the trainer holds from the version before
        # A floor is the machine's best: the fastest of three runs (a write's speed swings
        # with the page cache's state).
        floors = {
            f: max((run_stage(f, cfg) for _ in range(3)), key=lambda r: r["bytes_per_s_per_core"])
            for f in FLOORS
        }
        floor = min(r["bytes_per_s_per_core"] for r in floors.values())
        stages = {}
        for name in STAGES:
            print(f"{size}: {name} ...", flush=True)
            r = run_stage(name, cfg)
            r["floor_ratio"] = round(r["bytes_per_s_per_core"] / floor, 3)
            r["peak_rss_ratio"] = round(r["peak_rss_bytes"] / largest, 3)
            stages[name] = r
        offered = json.loads((scratch / "deltas" / "offered.json").read_text())
        delta_bytes = sum(d["delta"]["size"] for d in offered)
        changed = sum(
            delta.changed_words((scratch / "deltas" / f"{d['name']}.delta").read_bytes())
            for d in offered
        )
    finally:
        # Nothing stays behind unless asked: at 7B the two versions alone are 30 GB, and a
        # machine left that full fails whatever runs on it next (a CI's image builds did).
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(v1.parent, ignore_errors=True)
    return {
        "files": len(files),
        "version_bytes": version_bytes,
        "largest_file_bytes": largest,
        "made_s": round(made_s, 1),
        "changed_word_share": round(changed / (version_bytes / 2), 5),
        "delta_bytes": delta_bytes,
        "delta_bytes_ratio": round(delta_bytes / version_bytes, 5),
        "floors": floors,
        "floor_bytes_per_s_per_core": floor,
        "stages": stages,
        "below_goal": sorted(
            n
            for n, r in stages.items()
            if r["floor_ratio"] < GOAL_FLOOR_RATIO or r["peak_rss_ratio"] > GOAL_PEAK_RSS_RATIO
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="smollm2,1.5b,7b")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the versions made, their deltas and staged files (.cache/weights)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    sizes = {s: measure(s, args.keep) for s in args.sizes.split(",")}
    write_results(
        args.out,
        {
            "command": "python -m bench.weights " + " ".join(sys.argv[1:]),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "codec": delta.MAGIC.decode(),
            "step": f"AdamW-shaped, {shapes.STEP} per weight (bench/weights/shapes.py)",
            "goals": {"floor_ratio": GOAL_FLOOR_RATIO, "peak_rss_ratio": GOAL_PEAK_RSS_RATIO},
            "not_timed": "the transfers (origin upload, relay pull, follower fetch): bench/wan",
            "sizes": sizes,
        },
    )
    print(json.dumps({s: {n: r["floor_ratio"] for n, r in v["stages"].items()}
                      for s, v in sizes.items()}))  # fmt: skip


if __name__ == "__main__":
    main()
