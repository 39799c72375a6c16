"""SHARDCAST benchmark: ours against the reference (PyPI shardcast 0.3.2), same checkpoint.

One origin -> 2 relays -> 8 clients. Each run starts every server and every client (clients poll
for the version), then at t0 the trainer side publishes; the run ends when every client process
has exited holding a file it verified. Afterwards the bench re-hashes every client's file against
the source (outside the timing). Runs of the two systems alternate.

Where network namespaces are allowed, the same topology also runs with one namespace per node
and every node's link shaped with tc (`--rate-mbit` each way). Lower bound of that topology with
per-node bandwidth B and file size S: each client must receive S, and all 8*S leave the 2 relays,
so relays need at least 8*S / (2*B); the origin must send S to each relay (2*S / B). Everything
else can overlap (cut-through), so lower_bound = max(8*S/(2*B), 2*S/B, S/B).

    python -m bench.shardcast [--size-mib 512] [--runs 3] [--no-shaped]

Writes bench/results/shardcast.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from eth_account import Account
from safetensors.numpy import save_file

from .net import Loopback, ShapedNamespaces, namespaces_available

ROOT = Path(__file__).resolve().parents[2]
REF_VENV = ROOT / "bench" / ".venv-shardcast-ref"
REF_SPEC = "shardcast==0.3.2"
PY = sys.executable
RESULTS = ROOT / "bench" / "results" / "shardcast.json"


def log(msg: str) -> None:
    print(f"[shardcast-bench] {msg}", file=sys.stderr, flush=True)


def ensure_reference() -> Path:
    py = REF_VENV / "bin" / "python"
    ok = py.exists() and (
        subprocess.run(
            [str(py), "-c", "import shardcast; assert shardcast.__version__ == '0.3.2'"],
            capture_output=True,
        ).returncode
        == 0
    )
    if not ok:
        log(f"installing {REF_SPEC} into {REF_VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(REF_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", REF_SPEC], check=True)
    if shutil.which("wget") is None:
        raise SystemExit("the reference client needs wget (apt-get install wget)")
    return py


def make_checkpoint(path: Path, size_bytes: int, seed: int = 0) -> str:
    """A real safetensors file of random float32 tensors (64 MiB each), ~size_bytes in all."""
    rng = np.random.default_rng(seed)
    per = 16 * 1024 * 1024  # float32 elements per tensor
    tensors, left, i = {}, size_bytes // 4, 0
    while left > 0:
        n = min(per, left)
        tensors[f"layers.{i}.weight"] = rng.standard_normal(n, dtype=np.float32)
        left -= n
        i += 1
    save_file(tensors, str(path))
    return sha256_file(path)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while data := fh.read(8 * 1024 * 1024):
            h.update(data)
    return h.hexdigest()


class Procs:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self,
        name: str,
        cmd: list[str],
        cwd: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        logf = open(self.work / f"{name}.log", "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        # A session (process group) per node: stop_all kills whatever a node spawned too.
        p = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
        )
        self.procs.append((name, p))
        return p

    def tail(self, name: str, n: int = 2000) -> str:
        try:
            return (self.work / f"{name}.log").read_bytes()[-n:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop_all(self) -> None:
        for _, p in self.procs:
            _signal_group(p, signal.SIGTERM)
        for _, p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p, signal.SIGKILL)  # and any child the node left behind
            p.wait()
        self.procs.clear()


def _signal_group(p: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def leftover_processes(base: Path) -> list[str]:
    """Processes still running with the bench's scratch directory on their command line."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(base) in cmdline:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def cpu_floor(size: int, n_relays: int, n_clients: int) -> dict[str, float]:
    """The least CPU time the loopback broadcast can cost on this machine, spread over its
    cores. Every relay and every client receives the whole file once: (relays + clients) * size
    bytes are each copied out of the kernel by their receiver and into it by their sender, and
    hashed once (each shard is verified on arrival). Relays also write theirs to the page cache,
    which they serve from; a client's write can go to the disk without a CPU copy (O_DIRECT), so
    it costs nothing here. The per-byte costs are measured here, on 64 MiB, single-threaded."""
    buf = np.random.default_rng(2).integers(0, 255, 64 * 1024 * 1024, dtype=np.uint8).tobytes()
    n = len(buf)

    def per_byte(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - t0) / 3 / n

    hash_s = per_byte(lambda: hashlib.sha256(buf).digest())
    copy_s = per_byte(lambda: bytearray(buf))
    with tempfile.TemporaryFile() as fh:

        def write() -> None:
            fh.seek(0)
            fh.write(buf)

        write_s = per_byte(write)
    moved = (n_relays + n_clients) * size
    cores = os.cpu_count() or 1
    floor = (moved * (hash_s + 2 * copy_s) + n_relays * size * write_s) / cores
    return {
        "cpu_floor_s": round(floor, 3),
        "bytes_received": moved,
        "cores": cores,
        "hash_ns_per_byte": round(hash_s * 1e9, 4),
        "copy_ns_per_byte": round(copy_s * 1e9, 4),
        "write_ns_per_byte": round(write_s * 1e9, 4),
    }


def wait_http(url: str, procs: Procs, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} not up at {url}: {procs.tail(name)}")


def wait_ready(clients: list[tuple[str, subprocess.Popen[bytes]]], procs: Procs) -> None:
    """Block until every client process has started and is polling for the version."""
    deadline = time.monotonic() + 120
    for name, p in clients:
        while "waiting" not in procs.tail(name):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {procs.tail(name)}")
            time.sleep(0.05)
    time.sleep(0.5)


def wait_clients(
    clients: list[tuple[str, subprocess.Popen[bytes]]],
    procs: Procs,
    t0: float,
    timeout_s: float,
    watch: list[tuple[str, subprocess.Popen[bytes]]] = (),  # type: ignore[assignment]
) -> tuple[float, list[float]]:
    finished: dict[str, float] = {}
    deadline = t0 + timeout_s
    while len(finished) < len(clients):
        for name, p in watch:
            if p.poll() not in (None, 0):
                raise RuntimeError(f"{name} failed (rc {p.returncode}): {procs.tail(name)}")
        for name, p in clients:
            if name not in finished and p.poll() is not None:
                if p.returncode != 0:
                    raise RuntimeError(f"{name} failed (rc {p.returncode}): {procs.tail(name)}")
                finished[name] = time.monotonic() - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"clients not done after {timeout_s}s")
        time.sleep(0.02)
    per = sorted(finished.values())
    return per[-1], per


def check_outputs(paths: list[Path], expected: str) -> None:
    for p in paths:
        got = sha256_file(p)
        if got != expected:
            raise RuntimeError(f"{p}: sha256 {got} differs from the checkpoint {expected}")


def run_ours(
    net: Loopback,
    ckpt_dir: Path,
    sha: str,
    work: Path,
    n_relays: int,
    n_clients: int,
    timeout_s: float,
) -> dict[str, object]:
    account = Account.create()
    procs = Procs(work)
    relay = [PY, "-m", "prime_swarm.services.relay"]
    try:
        o = "origin"
        procs.start(
            o,
            net.prefix(o)
            + relay
            + [
                "origin",
                "--host",
                net.host(o),
                "--port",
                str(net.port(o)),
                "--data-dir",
                str(work / "origin"),
                "--trainer",
                account.address,
                "--keep-versions",
                "2",
                "--log-level",
                "WARNING",
            ],
        )
        relays = [f"relay{i}" for i in range(n_relays)]
        for r in relays:
            procs.start(
                r,
                net.prefix(r)
                + relay
                + [
                    "relay",
                    "--host",
                    net.host(r),
                    "--port",
                    str(net.port(r)),
                    "--data-dir",
                    str(work / r),
                    "--trainer",
                    account.address,
                    "--parent",
                    net.url(o),
                    "--poll-interval",
                    "0.1",
                    "--keep-versions",
                    "2",
                    "--timeout",
                    "20",
                    "--log-level",
                    "WARNING",
                ],
            )
        for n in [o, *relays]:
            wait_http(net.url(n) + "/healthz", procs, n)
        clients = []
        outs = []
        for i in range(n_clients):
            c = f"client{i}"
            out = work / c / "model"
            outs.append(out / "model.safetensors")
            (work / c).mkdir()
            cmd = relay + [
                "fetch",
                "--trainer",
                account.address,
                "--version",
                "1",
                "--out",
                str(out),
                "--wait",
                str(timeout_s),
                "--timeout",
                "20",
                "--no-progress",
            ]
            for r in relays:
                cmd += ["--relay", net.url(r)]
            clients.append((c, procs.start(c, net.prefix(c) + cmd, cwd=work / c)))
        wait_ready(clients, procs)
        t0 = time.monotonic()
        pub = procs.start(
            "publisher",
            net.prefix(o)
            + [
                PY,
                str(ROOT / "bench" / "shardcast" / "publish_ours.py"),
                "--origin",
                net.url(o),
                "--model-dir",
                str(ckpt_dir),
                "--version",
                "1",
            ],
            extra_env={"SC_BENCH_KEY": account.key.hex()},
        )
        total, per = wait_clients(clients, procs, t0, timeout_s, watch=[("publisher", pub)])
        if pub.wait(30) != 0:
            raise RuntimeError(f"publisher failed: {procs.tail('publisher')}")
    finally:
        procs.stop_all()
    check_outputs(outs, sha)
    return {"seconds": round(total, 3), "client_seconds": [round(x, 3) for x in per]}


def private_tmp(work: Path, name: str, cmd: list[str]) -> list[str]:
    """Run `cmd` with its own /tmp: the reference writes a fixed /tmp/dummy.bin in every node,
    and nodes racing on it fail their start-up probe (a quirk, not a property of the design)."""
    tmp = work / f"{name}.tmp"
    tmp.mkdir()
    return ["unshare", "-m", "sh", "-c", f'mount --bind "{tmp}" /tmp && exec "$@"', "sh", *cmd]


def run_reference(
    net: Loopback,
    ref_py: Path,
    ckpt: Path,
    sha: str,
    work: Path,
    n_relays: int,
    n_clients: int,
    timeout_s: float,
) -> dict[str, object]:
    node = str(ROOT / "bench" / "shardcast" / "ref_node.py")
    procs = Procs(work)
    go = work / "GO"
    try:
        o = "origin"
        procs.start(
            o,
            net.prefix(o)
            + [
                str(ref_py),
                node,
                "origin",
                "--host",
                net.host(o),
                "--port",
                str(net.port(o)),
                "--data-dir",
                str(work / "origin"),
                "--file",
                str(ckpt),
                "--go",
                str(go),
            ],
        )
        wait_http(net.url(o) + "/data1.bin", procs, o)
        relays = [f"relay{i}" for i in range(n_relays)]
        for r in relays:
            procs.start(
                r,
                net.prefix(r)
                + private_tmp(
                    work,
                    r,
                    [
                        str(ref_py),
                        node,
                        "middle",
                        "--host",
                        net.host(r),
                        "--port",
                        str(net.port(r)),
                        "--data-dir",
                        str(work / r),
                        "--upstream",
                        net.url(o),
                        "--check-interval",
                        "1",
                    ],
                ),
            )
            wait_http(net.url(r) + "/data1.bin", procs, r)
        servers = ",".join(net.url(r) for r in relays)
        clients, outs = [], []
        for i in range(n_clients):
            c = f"client{i}"
            (work / c).mkdir()
            out = work / c / "model.safetensors"
            outs.append(out)
            clients.append(
                (
                    c,
                    procs.start(
                        c,
                        net.prefix(c)
                        + private_tmp(
                            work,
                            c,
                            [
                                str(ref_py),
                                node,
                                "client",
                                "--servers",
                                servers,
                                "--version",
                                "v1",
                                "--workdir",
                                str(work / c),
                                "--out",
                                str(out),
                                "--deadline",
                                str(timeout_s),
                            ],
                        ),
                        cwd=work / c,
                    ),
                )
            )
        wait_ready(clients, procs)
        t0 = time.monotonic()
        go.touch()
        total, per = wait_clients(clients, procs, t0, timeout_s)
    finally:
        procs.stop_all()
    check_outputs(outs, sha)
    return {"seconds": round(total, 3), "client_seconds": [round(x, 3) for x in per]}


def lower_bound_s(size: int, rate_mbit: int, n_relays: int, n_clients: int) -> float:
    b = rate_mbit * 1e6 / 8
    return max(n_clients * size / (n_relays * b), n_relays * size / b, size / b)


def series(
    net: Loopback,
    runs: int,
    ckpt: Path,
    sha: str,
    base: Path,
    ref_py: Path,
    n_relays: int,
    n_clients: int,
    timeout_s: float,
) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {"ours": [], "reference": []}
    for i in range(runs):
        for system in ("ours", "reference"):
            work = Path(tempfile.mkdtemp(prefix=f"{system}-{i}-", dir=base))
            try:
                if system == "ours":
                    r = run_ours(net, ckpt.parent, sha, work, n_relays, n_clients, timeout_s)
                else:
                    r = run_reference(net, ref_py, ckpt, sha, work, n_relays, n_clients, timeout_s)
            except TimeoutError:
                # Counted at the timeout (a lower bound on the real time), never dropped.
                r = {"seconds": timeout_s, "timed_out": True, "client_seconds": []}
            finally:
                shutil.rmtree(work, ignore_errors=True)
            out[system].append(r)
            log(f"{'shaped ' if net.shaped else ''}run {i + 1}/{runs} {system}: {r['seconds']}s")
    return out


def median_s(rs: list[dict[str, object]]) -> float:
    return round(statistics.median(float(r["seconds"]) for r in rs), 3)  # type: ignore[arg-type]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--relays", type=int, default=2)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--timeout", type=float, default=400.0, help="per run")
    p.add_argument("--no-shaped", dest="shaped", action="store_false")
    p.add_argument("--shaped-size-mib", type=int, default=128)
    p.add_argument("--shaped-runs", type=int, default=1)
    p.add_argument("--rate-mbit", type=int, default=200)
    p.add_argument(
        "--shaped-timeout",
        type=float,
        default=240.0,
        help="per shaped run; a run past it counts at this value, flagged timed_out",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / "bench" / ".work-shardcast",
        help="scratch space (not under /tmp: reference nodes get a private /tmp)",
    )
    args = p.parse_args()

    ref_py = ensure_reference()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="shardcast-bench-", dir=args.workdir))
    nodes = [
        "origin",
        *[f"relay{i}" for i in range(args.relays)],
        *[f"client{i}" for i in range(args.clients)],
    ]
    try:
        ckpt_dir = base / "checkpoint"
        ckpt_dir.mkdir()
        ckpt = ckpt_dir / "model.safetensors"
        sha = make_checkpoint(ckpt, args.size_mib * 1024 * 1024)
        size = ckpt.stat().st_size
        log(f"checkpoint {size} bytes, sha256 {sha[:16]}")
        loop = series(
            Loopback(nodes),
            args.runs,
            ckpt,
            sha,
            base,
            ref_py,
            args.relays,
            args.clients,
            args.timeout,
        )
        result: dict[str, object] = {
            "size_bytes": size,
            "relays": args.relays,
            "clients": args.clients,
            "ours_s": median_s(loop["ours"]),
            "reference_s": median_s(loop["reference"]),
        }
        result["speedup"] = round(float(result["reference_s"]) / float(result["ours_s"]), 2)
        # Each system's median client (median over clients, then over runs): the reference's
        # straggler retry tail inflates its time-to-all, so this is the fairer comparison.
        for system in ("ours", "reference"):
            per_run = [
                statistics.median(r["client_seconds"]) for r in loop[system] if r["client_seconds"]
            ]  # type: ignore[arg-type]
            result[f"{system}_client_median_s"] = (
                round(statistics.median(per_run), 3) if per_run else None
            )
        floor = cpu_floor(size, args.relays, args.clients)
        result["cpu_floor"] = floor
        result["ours_over_cpu_floor"] = round(float(result["ours_s"]) / floor["cpu_floor_s"], 2)
        result["runs"] = {k: [r["seconds"] for r in v] for k, v in loop.items()}
        result["timed_out"] = {k: sum(bool(r.get("timed_out")) for r in v) for k, v in loop.items()}
        result["client_seconds"] = {k: [r["client_seconds"] for r in v] for k, v in loop.items()}
        result["shaped"] = None
        if not args.shaped:
            result["shaped_reason"] = "disabled with --no-shaped"
        elif (why := namespaces_available()) is not None:
            result["shaped_reason"] = why
        else:
            shaped_dir = base / "shaped"
            shaped_dir.mkdir()
            s_ckpt = shaped_dir / "model.safetensors"
            s_sha = make_checkpoint(s_ckpt, args.shaped_size_mib * 1024 * 1024, seed=1)
            s_size = s_ckpt.stat().st_size
            net = ShapedNamespaces(nodes, args.rate_mbit)
            net.setup()
            try:
                shaped = series(
                    net,
                    args.shaped_runs,
                    s_ckpt,
                    s_sha,
                    base,
                    ref_py,
                    args.relays,
                    args.clients,
                    args.shaped_timeout,
                )
            finally:
                net.teardown()
            lb = lower_bound_s(s_size, args.rate_mbit, args.relays, args.clients)
            ours = median_s(shaped["ours"])
            result["shaped"] = {
                "ours_s": ours,
                "reference_s": median_s(shaped["reference"]),
                "lower_bound_s": round(lb, 3),
                "lower_bound": (
                    f"per-node link B = {args.rate_mbit} Mbit/s each way, file S = {s_size} "
                    f"bytes: the {args.clients} clients' {args.clients}*S bytes leave the "
                    f"{args.relays} relays ({args.clients}*S/({args.relays}*B)), the origin "
                    f"sends S to each relay ({args.relays}*S/B), a client receives S (S/B); "
                    "with cut-through these overlap, so the bound is the largest"
                ),
                "efficiency": round(lb / ours, 3),
                "size_bytes": s_size,
                "rate_mbit_per_node": args.rate_mbit,
                "runs": {k: [r["seconds"] for r in v] for k, v in shaped.items()},
                "timed_out": {
                    k: sum(bool(r.get("timed_out")) for r in v) for k, v in shaped.items()
                },
            }
        result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
        result["leftover_processes"] = leftover_processes(base)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, args.out)
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
