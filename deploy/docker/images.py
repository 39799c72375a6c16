"""`make images`: every service image built here, where no registry and no package index is
reachable from a build, and each image's size written to bench/results/images.json.

    .venv/bin/python deploy/docker/images.py [--extras relay,worker] [--tag local]

1. A Docker engine: the running one, or `dockerd` started with address pools of our choosing
   (nothing else on this machine uses 172.30/16 and 172.31/16).
2. A base image instead of `python:3.11-slim`: Debian bookworm with python3 made by
   `debootstrap` and imported (`prime-swarm-base:bookworm`, made once).
3. A wheelhouse instead of the index (deploy/docker/wheelhouse/, made once per pyproject.toml):
   the host's pip fills it with wheels of every service extra (torch the pinned CPU build, as in
   `make setup`), and the anvil binary `make setup` installed.
4. deploy/docker/Dockerfile built once per extra with those three build arguments; on a user's
   machine the same file builds from `python:3.11-slim` and the index with none of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "deploy/docker/wheelhouse"
ANVIL = REPO / ".tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
BASE = "prime-swarm-base:bookworm"
EXTRAS = ("relay", "orchestrator", "validator", "trainer", "worker", "chain")
# Services of docker-compose.yml by the image each runs (model-init runs the trainer image).
SERVICES = {
    "relay": ["origin", "relay-0", "relay-1"],
    "orchestrator": ["orchestrator"],
    "validator": ["validator"],
    "trainer": ["trainer", "model-init"],
    "worker": ["worker"],
    "chain": ["anvil", "deployer"],
}
# Requirements that hold on the base's Python (bookworm's 3.11.2) and not on the host's, which
# resolves the wheelhouse: redis needs async-timeout below 3.11.3.
BASE_ONLY = ["async-timeout>=4.0.3"]
DAEMON_ARGS = ["--default-address-pool", "base=172.31.0.0/16,size=24", "--bip", "172.30.0.1/24"]


def run(*argv: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


def engine(timeout_s: float = 60) -> None:
    """The Docker engine answers, started here if it does not."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return
    if shutil.which("dockerd") is None:
        sys.exit("images: no Docker engine; `apt-get install docker.io` installs one")
    log = open(REPO / ".cache/dockerd.log", "ab")  # noqa: SIM115 - outlives this process
    subprocess.Popen(["dockerd", *DAEMON_ARGS], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            sys.exit(f"images: dockerd silent after {timeout_s:.0f} s (.cache/dockerd.log)")
        time.sleep(1)


def base_image() -> None:
    """Debian bookworm with python3, imported as BASE (about 50 s, once)."""
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode == 0:
        return
    with tempfile.TemporaryDirectory() as root:
        run(
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python3-pip,ca-certificates",
            "bookworm",
            root,
            stdout=subprocess.DEVNULL,
        )
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        run("docker", "import", "-", BASE, stdin=tar.stdout)
        tar.wait()


def wheelhouse() -> None:
    """Wheels of every extra (and of the build backend), once per pyproject.toml."""
    stamp = WHEELHOUSE / ".pyproject.sha256"
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text() == digest):
        pip = [sys.executable, "-m", "pip"]
        run(*pip, "download", "-q", "--dest", str(WHEELHOUSE), "pip", "setuptools>=68", "wheel")
        run(*pip, "download", "-q", "--dest", str(WHEELHOUSE), *BASE_ONLY)
        run(*pip, "wheel", "-q", "--wheel-dir", str(WHEELHOUSE), f"{REPO}[{','.join(EXTRAS)}]")
        stamp.write_text(digest)
    shutil.copy2(ANVIL, WHEELHOUSE / "anvil")


def build(extra: str, tag: str) -> None:
    args = {"EXTRA": extra, "PYTHON_IMAGE": BASE, "NODE_IMAGE": BASE, "WHEELHOUSE": "1"}
    flags = [f for k, v in args.items() for f in ("--build-arg", f"{k}={v}")]
    run("docker", "build", "-q", "-f", "deploy/docker/Dockerfile", *flags,
        "-t", f"prime-swarm-{extra}:{tag}", ".", cwd=REPO)  # fmt: skip


def size_mb(image: str) -> float:
    out = run("docker", "image", "inspect", "-f", "{{.Size}}", image, capture_output=True)
    return round(int(out.stdout) / 2**20, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extras", default=",".join(EXTRAS))
    ap.add_argument("--tag", default="local")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/images.json")
    args = ap.parse_args()
    extras = [e for e in args.extras.split(",") if e]
    if unknown := set(extras) - set(EXTRAS):
        sys.exit(f"images: --extras: unknown {sorted(unknown)}; known: {', '.join(EXTRAS)}")
    engine()
    base_image()
    wheelhouse()
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    images = doc.setdefault("images", {})
    for extra in extras:
        t0 = time.monotonic()
        build(extra, args.tag)
        mb = size_mb(f"prime-swarm-{extra}:{args.tag}")
        print(f"prime-swarm-{extra}:{args.tag}  {mb} MB  ({time.monotonic() - t0:.0f} s)")
        for service in SERVICES[extra]:
            images[service] = {"size_mb": mb, "extra": extra, "image": f"prime-swarm-{extra}"}
    doc["base_image"] = {"image": BASE, "size_mb": size_mb(BASE)}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
