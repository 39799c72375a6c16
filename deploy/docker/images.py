"""`make images`: every image docker-compose.yml runs, built here, where no registry and no
package index is reachable from a build; each image's size written to bench/results/images.json.

    .venv/bin/python deploy/docker/images.py [--extras relay,worker] [--tag local]

1. A Docker engine: the running one, or `dockerd` started with address pools of our choosing
   (nothing else on this machine uses 172.30/16 and 172.31/16).
2. Base images instead of registry pulls, made once each by `debootstrap` and imported:
   `prime-swarm-base:bookworm` (python3, for our images) and `prime-swarm-infra:bookworm`
   (Debian's redis-server, prometheus and haproxy, for deploy/docker/infra.Dockerfile). Each is
   labelled with its package list, and made again when that list changes.
3. A wheelhouse instead of the index, made once per pyproject.toml in this machine's cache
   (~/.cache/prime-swarm/wheelhouse, kept between clones) and copied into the build context
   (deploy/docker/wheelhouse/): wheels of every service extra (torch the pinned CPU build, as in
   `make setup`), and the anvil binary `make setup` installed.
4. Our images built by compose itself, one service per extra, with deploy/docker/compose.local.yml
   over docker-compose.yml (the base image and the wheelhouse as build arguments); on a user's
   machine `docker compose build` builds the same Dockerfile from `python:3.11-slim`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "deploy/docker/wheelhouse"
WHEEL_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prime-swarm" / "wheelhouse"
)
ANVIL = REPO / ".tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
# docker-compose.yml with the override that names the local bases: every compose command here.
COMPOSE_FILES = ("docker-compose.yml", "deploy/docker/compose.local.yml")
BASE = "prime-swarm-base:bookworm"
INFRA = "prime-swarm-infra:bookworm"
# debootstrap --include of each base. wget: the compose healthcheck of prometheus calls it.
# haproxy: the balancer in front of the orchestrator replicas of docker-compose.ha.yml.
BASE_PACKAGES = {
    BASE: "python3,python3-venv,python3-pip,ca-certificates",
    INFRA: "redis-server,prometheus,haproxy,wget,ca-certificates",
}
# The label a base carries its package list in: a base made from an older list (before haproxy
# joined the infra one) is made again, not reused without the program a target needs.
PACKAGES_LABEL = "io.prime-swarm.packages"
# Images of infra.Dockerfile, by its target; compose.local.yml names them.
INFRA_IMAGES = {
    "redis": "prime-swarm-redis:bookworm",
    "prometheus": "prime-swarm-prometheus:bookworm",
    "haproxy": "prime-swarm-haproxy:bookworm",
}
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
    (REPO / ".cache").mkdir(exist_ok=True)
    log = open(REPO / ".cache/dockerd.log", "ab")  # noqa: SIM115 - outlives this process
    subprocess.Popen(["dockerd", *DAEMON_ARGS], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            sys.exit(f"images: dockerd silent after {timeout_s:.0f} s (.cache/dockerd.log)")
        time.sleep(1)


def packages_of(image: str) -> str | None:
    """The package list a base was made from (its PACKAGES_LABEL); None if there is no such
    image or it has no label."""
    out = subprocess.run(
        ["docker", "image", "inspect", "-f", f'{{{{index .Config.Labels "{PACKAGES_LABEL}"}}}}',
         image], capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip() or None if out.returncode == 0 else None


def base_image(name: str) -> None:
    """Debian bookworm with BASE_PACKAGES[name], imported as `name` (about a minute, once per
    package list)."""
    if packages_of(name) == BASE_PACKAGES[name]:
        return
    with tempfile.TemporaryDirectory() as root:
        run("debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES[name]}", "bookworm",
            root, stdout=subprocess.DEVNULL)  # fmt: skip
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        run("docker", "import", "--change", f"LABEL {PACKAGES_LABEL}={BASE_PACKAGES[name]}",
            "-", name, stdin=tar.stdout)  # fmt: skip
        tar.wait()


def wheelhouse() -> None:
    """Wheels of every extra (and of the build backend), once per pyproject.toml, then copied
    into the build context (a fresh clone's context has none)."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    stamp = WHEEL_CACHE / ".pyproject.sha256"
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text() == digest):
        pip = [sys.executable, "-m", "pip"]
        run(*pip, "download", "-q", "--dest", str(WHEEL_CACHE), "pip", "setuptools>=68", "wheel")
        run(*pip, "download", "-q", "--dest", str(WHEEL_CACHE), *BASE_ONLY)
        run(*pip, "wheel", "-q", "--wheel-dir", str(WHEEL_CACHE), f"{REPO}[{','.join(EXTRAS)}]")
        stamp.write_text(digest)
    for wheel in WHEEL_CACHE.glob("*.whl"):
        copy = WHEELHOUSE / wheel.name
        if not copy.exists() or copy.stat().st_size != wheel.stat().st_size:
            shutil.copy2(wheel, copy)
    shutil.copy2(ANVIL, WHEELHOUSE / "anvil")


# The legacy builder's upload of the build context (330 MB with the wheelhouse) sometimes breaks
# off: the engine logs "Error processing tar file(exit status 1): unexpected EOF", the client
# "io: read/write on closed pipe", and the same build, run again, passes (2 of 8 builds on a
# fresh machine here). A build that fails for any other reason fails again, at the same cost as
# a cached rebuild.
BUILD_TRIES = 3
CONTEXT_BROKEN = "Error processing tar file"


def quietly(what: str, *argv: str, env: dict[str, str] | None = None) -> None:
    """A build whose chatter (compose's warning per secret file not made yet, the legacy
    builder's deprecation note) shows only when it fails; tried again when only the upload of
    its context broke (CONTEXT_BROKEN)."""
    for attempt in range(1, BUILD_TRIES + 1):
        out = subprocess.run(
            argv, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True
        )
        if out.returncode == 0:
            return
        broken = CONTEXT_BROKEN in out.stdout + out.stderr or "closed pipe" in out.stderr
        if not broken or attempt == BUILD_TRIES:
            break
        print(f"images: {what}: the build context's upload broke off; building again",
              file=sys.stderr)  # fmt: skip
    sys.exit(f"images: {what} failed:\n{unnoisy(out.stdout)[-3000:]}{unnoisy(out.stderr)[-3000:]}")


# Lines a failed build's output is mostly made of, none of them why it failed: compose's warning
# for each secret file not made yet, pip's for each find-links folder it does not have.
NOISE = ("uses an undefined secret file", "WARNING: Location 'file:")


def unnoisy(text: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True) if not any(n in ln for n in NOISE))


def build(extra: str, tag: str) -> None:
    """The image of `extra`, built by compose (docker-compose.yml with compose.local.yml) from
    its first service; the others share it."""
    files = [f for name in COMPOSE_FILES for f in ("-f", name)]
    quietly(f"building {extra}", "docker-compose", *files, "build", "-q", SERVICES[extra][0],
            env={"SWARM_TAG": tag})  # fmt: skip


def build_infra() -> None:
    base_image(INFRA)
    for target, image in INFRA_IMAGES.items():
        quietly(f"building {image}", "docker", "build", "-q", "-f",
                "deploy/docker/infra.Dockerfile", "--target", target,
                "--build-arg", f"INFRA_IMAGE={INFRA}", "-t", image, ".")  # fmt: skip


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
    base_image(BASE)
    wheelhouse()
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    images = doc.setdefault("images", {})
    build_infra()
    for service, image in INFRA_IMAGES.items():
        images[service] = {"size_mb": size_mb(image), "extra": None, "image": image.split(":")[0]}
    for extra in extras:
        t0 = time.monotonic()
        build(extra, args.tag)
        mb = size_mb(f"prime-swarm-{extra}:{args.tag}")
        print(f"prime-swarm-{extra}:{args.tag}  {mb} MB  ({time.monotonic() - t0:.0f} s)")
        for service in SERVICES[extra]:
            images[service] = {"size_mb": mb, "extra": extra, "image": f"prime-swarm-{extra}"}
    # A rebuild leaves the image it replaced untagged (1.5 GB for the torch ones): five rebuilds
    # here held 38 GB and filled the disk. Only our runtime images carry this label; the build
    # stages stay, as the layer cache of the next build.
    run("docker", "image", "prune", "--force", "--filter", "label=io.prime-swarm.extra",
        stdout=subprocess.DEVNULL)  # fmt: skip
    doc["base_image"] = {"image": BASE, "size_mb": size_mb(BASE)}
    doc["infra_base_image"] = {"image": INFRA, "size_mb": size_mb(INFRA)}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
