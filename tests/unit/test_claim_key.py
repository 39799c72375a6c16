"""prime-claim-key (deploy/docker/claim_key.py): each replica of a scaled service gets its own
key from the pool, held by a real flock for as long as the process that claimed it lives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from script_files import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "claim_key.py"


@pytest.fixture(scope="module")
def claim_key() -> ModuleType:
    return load_script(SCRIPT)


@pytest.fixture()
def pool(tmp_path: Path) -> Path:
    keys = tmp_path / "secrets"
    keys.mkdir()
    for i in (0, 1, 2, 10):
        (keys / f"worker-key-{i}.json").write_text("{}")
    (keys / "redis.password").write_text("not a key")
    return keys


def _hold(pool: Path, locks: Path) -> subprocess.Popen[str]:
    """A replica: claims a key, prints which, and keeps the lock until killed."""
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--keys", str(pool), "--locks", str(locks), "--",
         sys.executable, "-c", "import os, sys, time; print(os.environ['PRIME_WORKER_KEY_FILE'],"
         " flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_replicas_claim_different_keys_in_index_order(pool: Path, tmp_path: Path) -> None:
    locks = tmp_path / "claims"
    replicas = [_hold(pool, locks) for _ in range(2)]
    try:
        got = sorted(Path(p.stdout.readline().strip()).name for p in replicas)  # type: ignore[union-attr]
        assert got == ["worker-key-0.json", "worker-key-1.json"]
    finally:
        for p in replicas:
            p.kill()
            p.wait()


def test_a_dead_replicas_key_is_free_again(
    claim_key: ModuleType, pool: Path, tmp_path: Path
) -> None:
    locks = tmp_path / "claims"
    first = _hold(pool, locks)
    assert first.stdout.readline().strip().endswith("worker-key-0.json")  # type: ignore[union-attr]
    key, fd = claim_key.claim(pool, locks)
    assert key.name == "worker-key-1.json"  # 0 is held by the live process
    first.kill()
    first.wait()
    again, fd2 = claim_key.claim(pool, locks)
    assert again.name == "worker-key-0.json"  # its holder died: the lock went with it
    os.close(fd)
    os.close(fd2)


def test_an_exhausted_pool_says_what_to_do(pool: Path, tmp_path: Path) -> None:
    locks = tmp_path / "claims"
    replicas = [_hold(pool, locks) for _ in range(4)]
    try:
        names = {Path(p.stdout.readline().strip()).name for p in replicas}  # type: ignore[union-attr]
        assert names == {f"worker-key-{i}.json" for i in (0, 1, 2, 10)}
        late = subprocess.run(
            [sys.executable, str(SCRIPT), "--keys", str(pool), "--locks", str(locks), "--", "true"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert late.returncode == 3
        assert late.stderr.count("\n") == 1 and "compose-secrets --workers" in late.stderr
    finally:
        for p in replicas:
            p.kill()
            p.wait()


def test_no_command_is_a_usage_error(pool: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--keys", str(pool)], capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert r.returncode == 2 and "command" in r.stderr
