"""One stage of a version's weight path, run in a process of its own so that its CPU time and
peak memory are its own: `python -m bench.weights.stage NAME JSON`; prints one JSON line.

The stages are the project's own functions, called as the trainer and a follower call them
(libs/shardcast): nothing here reimplements them. The floors (`sha256`, `copy`) read the same
files through the same 4 MiB pieces.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from eth_account import Account

from prime_swarm.libs.shardcast import client
from prime_swarm.libs.shardcast.manifest import DEFAULT_SHARD_SIZE, build_manifest
from prime_swarm.libs.shardcast.publish import encode_deltas
from prime_swarm.protocol.manifest_signing import sign_manifest
from prime_swarm.protocol.messages import FileDelta, Manifest

PIECE = 4 << 20
KEY = "0x" + "11" * 32  # a bench key: signs nothing outside this process


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".safetensors")


def sha256(cfg: dict) -> int:
    """The machine's hash floor: one thread, the largest file."""
    f = max(_files(Path(cfg["v2"])), key=lambda p: p.stat().st_size)
    h = hashlib.sha256()
    with open(f, "rb", buffering=0) as fh:
        while chunk := fh.read(PIECE):
            h.update(chunk)
    return f.stat().st_size


def copy(cfg: dict) -> int:
    """The machine's copy floor: the largest file read and written through one 4 MiB buffer."""
    f = max(_files(Path(cfg["v2"])), key=lambda p: p.stat().st_size)
    out = Path(cfg["scratch"]) / "copy"
    buf = bytearray(PIECE)
    view = memoryview(buf)
    with open(f, "rb", buffering=0) as src, open(out, "wb", buffering=0) as dst:
        while n := src.readinto(buf):
            dst.write(view[:n])
    out.unlink()
    return f.stat().st_size


def hash_version(cfg: dict) -> int:
    """The trainer's manifest: every file hashed, per shard and whole (build_manifest)."""
    m = build_manifest(cfg["v2"], 2, 1, DEFAULT_SHARD_SIZE, Account.from_key(KEY).address)
    Path(cfg["scratch"], "manifest.json").write_text(m.model_dump_json())
    return sum(f.size for f in m.files)


def hash_parent(cfg: dict) -> int:
    """Setup, not a stage: the parent version's manifest, which the trainer holds from
    publishing it (its file hashes spare the encode a pass over the parent)."""
    m = build_manifest(cfg["v1"], 1, None, DEFAULT_SHARD_SIZE, Account.from_key(KEY).address)
    Path(cfg["scratch"], "parent_manifest.json").write_text(m.model_dump_json())
    return sum(f.size for f in m.files)


def sign(cfg: dict) -> int:
    m = Manifest.model_validate_json(Path(cfg["scratch"], "manifest.json").read_text())
    sign_manifest(m, Account.from_key(KEY))
    return sum(f.size for f in m.files)


def encode(cfg: dict) -> int:
    """The trainer's deltas against the parent version (encode_deltas), kept for `rebuild`."""
    out = Path(cfg["scratch"]) / "deltas"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    parent = Manifest.model_validate_json(Path(cfg["scratch"], "parent_manifest.json").read_text())
    known = {f.name: f.sha256 for f in parent.files}
    offered = encode_deltas(
        Path(cfg["v2"]), Path(cfg["v1"]), out, DEFAULT_SHARD_SIZE, parent_hashes=known
    )
    (out / "offered.json").write_text(json.dumps([d.model_dump(mode="json") for d in offered]))
    return sum(p.stat().st_size for p in _files(Path(cfg["v2"])))


def rebuild(cfg: dict) -> int:
    """A follower's rebuild of each file from its held parent and the delta, hashed against the
    signed file hash as it goes (client._rebuild), into a staging folder."""
    deltas = Path(cfg["scratch"]) / "deltas"
    m = Manifest.model_validate_json(Path(cfg["scratch"], "manifest.json").read_text())
    offered = [
        FileDelta.model_validate(d) for d in json.loads((deltas / "offered.json").read_text())
    ]
    staging = Path(cfg["scratch"]) / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    done = 0
    for d in offered:
        f = next(f for f in m.files if f.name == d.name)
        shutil.copy(deltas / d.delta.name, staging / d.delta.name)  # the fetched delta
        if not client._rebuild(f, d, Path(cfg["v1"]) / f.name, staging):
            raise SystemExit(f"{f.name}: the delta did not rebuild the signed file")
        done += f.size
    return done


def verify(cfg: dict) -> int:
    """The audit's whole-file re-hash of a staged version (download_version verify_files)."""
    m = Manifest.model_validate_json(Path(cfg["scratch"], "manifest.json").read_text())
    staging = Path(cfg["scratch"]) / "staging"
    for f in m.files:
        if not (staging / f.name).exists():
            os.link(Path(cfg["v2"]) / f.name, staging / f.name)
    signed = sign_manifest(m, Account.from_key(KEY))
    client._verify_files(signed, staging)
    return sum(f.size for f in m.files)


def install(cfg: dict) -> int:
    """The staged version renamed into place over the one before it (client._install)."""
    staging, out = Path(cfg["scratch"]) / "staging", Path(cfg["scratch"]) / "installed"
    if not out.exists():
        out.mkdir()
        (out / "old").write_text("the version before")
    client._install(staging, out)
    size = sum(p.stat().st_size for p in _files(out))
    shutil.rmtree(out)
    return size


STAGES = {
    f.__name__: f
    for f in (sha256, copy, hash_parent, hash_version, sign, encode, rebuild, verify, install)
}


def peak_rss() -> int:
    """This process's peak resident memory since it began (VmHWM: the high-water mark of its
    own address space; getrusage's ru_maxrss also counts the parent's, forked before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    name, cfg = sys.argv[1], json.loads(sys.argv[2])
    started, cpu = time.perf_counter(), time.process_time()  # every thread's CPU time
    moved = STAGES[name](cfg)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"bytes": moved, "wall_s": wall, "cpu_s": cpu, "peak_rss": peak_rss()}))


if __name__ == "__main__":
    main()
