"""One delivery case of the time-to-N benchmark on a live testbed: a version published at the
origin, and the seconds until each of N followers holds it verified and installed.

Systems: `ours` (origin -> a relay per region -> the region's followers), `direct` (every
follower pulls from the origin) and `reference` (PyPI shardcast 0.3.2 on the same hosts: its
origin, a middle node per region, its clients). Servers start fresh for every case; followers
start before the publish and wait for the version, so a process's start-up is never timed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from eth_account.signers.local import LocalAccount

from prime_swarm.deploy.testbed.net import LiveTestbed
from prime_swarm.deploy.testbed.topology import Host
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.shardcast import publish_version

PORT = 8700
SHARD = 16 << 20  # the `--model smollm2` preset's shard size
REF_VENV = Path(__file__).resolve().parents[1] / ".venv-shardcast-ref"
REF_NODE = Path(__file__).resolve().parents[1] / "shardcast" / "ref_node.py"
# The reference retries forever; a client not done by then counts as never done.
REF_DEADLINE_S = 600
POLL_S = 1.0  # the reference clients poll their middle as often as ours poll their relay


def log(msg: str) -> None:
    print(f"[wan] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat (user, nice,
    system, idle, iowait, irq, softirq, steal; guest time is already inside user)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def followers(live: LiveTestbed, n: int) -> list[Host]:
    """The first n followers, taken from the regions in turn (eu-1, sa-1, asia-1, eu-2, ...)."""
    groups = [live.in_group(g) for g in live.bed.hosts if g.startswith("follower-")]
    order = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    if n > len(order):
        raise ValueError(f"the testbed has {len(order)} followers, not {n}")
    return order[:n]


def relay_of(host: Host) -> str:
    return f"relay-{host.region}"


@dataclass
class Arrivals:
    """What one version's delivery to N followers did."""

    seconds: dict[str, float | None]  # follower -> seconds after t0 (None: never)
    wrong_installs: int = 0
    publish_s: float = 0.0
    bytes: int = 0
    retries: int = 0
    notes: list[str] = field(default_factory=list)
    # CPU-seconds the case spent on this machine, by part: followers (each from ready to its
    # exit), the origin and relays, the link emulator. Over the machine's cores, the least
    # wall time the case could take here whatever the links: beside the link bound, it says
    # which of the two a case is up against.
    cpu_s: dict[str, float] = field(default_factory=dict)
    # Share of the machine's CPU time that was not idle from the publish to the last arrival,
    # the kernel's included (the shaped links' and sockets' softirq work is charged to no
    # process above). Near 1.0 the case measured this machine, not the links.
    machine_busy: float | None = None

    @property
    def completed(self) -> bool:
        return all(s is not None for s in self.seconds.values())

    @property
    def last_s(self) -> float | None:
        return max(self.seconds.values()) if self.completed else None  # type: ignore[type-var]


class Delivery:
    def __init__(self, live: LiveTestbed, work: Path, trainer: LocalAccount) -> None:
        self.live, self.work, self.trainer = live, work, trainer
        self.procs: list[ManagedProcess] = []

    # ------------------------------------------------------------------ servers
    def start_ours(self, case_dir: Path, relays: list[str]) -> str:
        live, addr = self.live, self.trainer.address
        relay = [sys.executable, "-m", "prime_swarm.services.relay"]
        common = ["--host", "0.0.0.0", "--port", str(PORT), "--trainer", addr]
        self.procs.append(
            live.spawn(
                "operator",
                "origin",
                [*relay, "origin", *common, "--data-dir", str(case_dir / "origin")],
                log_dir=case_dir,
            )  # fmt: skip
        )
        origin = live.url("operator", PORT)
        for r in relays:
            self.procs.append(
                live.spawn(
                    r,
                    r,
                    [*relay, "relay", *common, "--parent", origin, "--data-dir", str(case_dir / r)],
                    log_dir=case_dir,
                )  # fmt: skip
            )
        for p, host in zip(self.procs, ["operator", *relays], strict=True):
            p.wait_http(f"{live.url(host, PORT)}/healthz", 60)
        return origin

    def stop_all(self) -> None:
        for p in self.procs:
            p.stop(timeout_s=5)
        self.procs.clear()

    # ------------------------------------------------------------------ ours and direct
    def follow(
        self,
        case_dir: Path,
        hosts: list[Host],
        sources: Callable[[Host], list[str]],
        version: int,
        publish: Callable[[], object],
        *,
        held_version: int | None = None,
        late: dict[str, float] | None = None,
        during: Callable[[float], None] | None = None,
        deadline_s: float = 900.0,
    ) -> Arrivals:
        """Followers of `version` started (those in `late` that many seconds after t0), the
        version published at t0, every follower waited for; `during(t)` is called while it
        runs (faults). Returns the arrival times."""
        late = late or {}
        results = {h.name: case_dir / "results" / f"{h.name}-v{version}.json" for h in hosts}
        (case_dir / "results").mkdir(parents=True, exist_ok=True)
        running: dict[str, ManagedProcess] = {}

        def start(h: Host) -> None:
            out = case_dir / "followers" / h.name
            argv = [sys.executable, "-m", "bench.wan.follower", "--trainer", self.trainer.address,
                    "--version", str(version), "--out", str(out / f"v{version}"),
                    "--deadline", str(deadline_s), "--result", str(results[h.name])]  # fmt: skip
            for url in sources(h):
                argv += ["--relay", url]
            if held_version is not None:
                argv += ["--held", str(out / f"v{held_version}"), "--held-version",
                         str(held_version)]  # fmt: skip
            running[h.name] = self.live.spawn(
                h.name, f"{h.name}-v{version}", argv, log_dir=case_dir / "logs"
            )

        for h in hosts:
            if h.name not in late:
                start(h)
        # Every follower started (64 interpreters take this machine half a minute) and waiting.
        ready = [results[h.name].with_suffix(".ready") for h in hosts if h.name not in late]
        settle = time.monotonic() + 180
        while not all(r.exists() for r in ready) and time.monotonic() < settle:
            time.sleep(0.2)
        time.sleep(2.0)
        servers_before = sum(c for c in (p.cpu_seconds() for p in self.procs) if c is not None)
        link_before = self.live.link_stats()["cpu_s"]
        t0 = time.time()
        machine_before = cpu_times()
        began = time.monotonic()
        publish()
        publish_s = time.monotonic() - began
        pending = {h.name: late.get(h.name, 0.0) for h in hosts if h.name in late}
        while time.monotonic() - began < deadline_s + 30:
            elapsed = time.monotonic() - began
            for name, at in list(pending.items()):
                if elapsed >= at:
                    start(self.live.hosts[name])
                    del pending[name]
            if during is not None:
                during(elapsed)
            if not pending and all(not p.alive() for p in running.values()):
                break
            time.sleep(0.2)
        busy, total = (a - b for a, b in zip(cpu_times(), machine_before, strict=True))
        for p in running.values():
            p.stop(timeout_s=5)
        arrivals = Arrivals(seconds={}, publish_s=round(publish_s, 2))
        arrivals.machine_busy = round(busy / total, 3) if total else None
        servers = [p.cpu_seconds() for p in self.procs]
        arrivals.cpu_s = {
            "followers": 0.0,
            "servers": round(sum(c for c in servers if c is not None) - servers_before, 1),
            "link": round(self.live.link_stats()["cpu_s"] - link_before, 1),
        }
        for name, path in results.items():
            try:
                r = json.loads(path.read_text())
            except (OSError, ValueError):
                arrivals.seconds[name] = None
                continue
            done = r["done_at"]
            arrivals.seconds[name] = None if done is None else round(done - t0, 3)
            arrivals.retries += r["attempts"] - 1
            arrivals.cpu_s["followers"] = round(arrivals.cpu_s["followers"] + r["cpu_s"], 1)
            arrivals.notes += [f"{name}: {e}" for e in r["errors"][:2]]
        return arrivals

    def check_installs(self, case_dir: Path, hosts: list[Host], version: int, src: Path) -> int:
        """Followers whose installed files differ from the published ones (0 is the bar)."""
        truth = {f.name: sha256(f) for f in src.iterdir() if f.is_file()}
        wrong = 0
        for h in hosts:
            out = case_dir / "followers" / h.name / f"v{version}"
            if not out.is_dir():
                continue  # never arrived: counted as not completed, not as wrong
            got = {f.name: sha256(f) for f in out.iterdir() if f.is_file()}
            wrong += int(any(got.get(k) != v for k, v in truth.items()))
        return wrong

    def ours(
        self,
        case_dir: Path,
        hosts: list[Host],
        v1: Path,
        v2: Path | None,
        *,
        direct: bool = False,
        fallback: bool = False,
        late: dict[str, float] | None = None,
        during: Callable[[float], None] | None = None,
    ) -> dict[str, Arrivals]:
        """Version 1 whole, then (with v2) version 2 by its delta, to the same followers."""
        relays = [] if direct else sorted({relay_of(h) for h in hosts})
        origin = self.start_ours(case_dir, relays)
        live = self.live

        def sources(h: Host) -> list[str]:
            if direct:
                return [origin]
            return [live.url(relay_of(h), PORT)] + ([origin] if fallback else [])

        out: dict[str, Arrivals] = {}
        try:
            manifests: list[object] = []

            def publish(model: Path, version: int, parent: Path | None) -> Callable[[], None]:
                def go() -> None:
                    manifests.append(
                        publish_version(
                            origin,
                            model,
                            version,
                            None if parent is None else version - 1,
                            self.trainer,
                            shard_size=SHARD,
                            timeout=60,
                            parent_dir=parent,
                        )  # fmt: skip
                    )

                return go

            log(f"  v1 (full) to {len(hosts)}")
            a = self.follow(case_dir, hosts, sources, 1, publish(v1, 1, None), late=late,
                            during=during)  # fmt: skip
            a.bytes = sum(f.size for f in manifests[-1].manifest.files)  # type: ignore[attr-defined]
            a.wrong_installs = self.check_installs(case_dir, hosts, 1, v1)
            out["full"] = a
            if v2 is not None and a.completed:
                log(f"  v2 (delta) to {len(hosts)}")
                d = self.follow(case_dir, hosts, sources, 2, publish(v2, 2, v1), held_version=1)
                m = manifests[-1].manifest  # type: ignore[attr-defined]
                d.bytes = sum(x.delta.size for x in m.deltas) or sum(f.size for f in m.files)
                d.wrong_installs = self.check_installs(case_dir, hosts, 2, v2)
                out["delta"] = d
        finally:
            self.stop_all()
            shutil.rmtree(case_dir / "followers", ignore_errors=True)
            for d in ["origin", *relays]:
                shutil.rmtree(case_dir / d, ignore_errors=True)
        return out

    # ------------------------------------------------------------------ the reference
    def reference(self, case_dir: Path, hosts: list[Host], v1: Path) -> Arrivals:
        """shardcast 0.3.2: its origin broadcasts the weights file, a middle node per region
        pulls it, each follower's client polls its region's middle."""
        live, py = self.live, str(REF_VENV / "bin" / "python")
        relays = sorted({relay_of(h) for h in hosts})
        go = case_dir / "go"
        src = v1 / "model.safetensors"
        node = [py, str(REF_NODE)]
        try:
            self.procs.append(live.spawn("operator", "ref-origin", [*node, "origin", "--host",
                "0.0.0.0", "--port", str(PORT), "--data-dir", str(case_dir / "ref-origin"),
                "--file", str(src), "--go", str(go)], log_dir=case_dir))  # fmt: skip
            origin = live.url("operator", PORT)
            for r in relays:
                self.procs.append(live.spawn(r, f"ref-{r}", [*node, "middle", "--host", "0.0.0.0",
                    "--port", str(PORT), "--data-dir", str(case_dir / f"ref-{r}"), "--upstream",
                    origin, "--check-interval", "1"], log_dir=case_dir))  # fmt: skip
            time.sleep(4.0)  # its servers have no health route; they bind within a second
            clients: dict[str, ManagedProcess] = {}
            for h in hosts:
                work = case_dir / "ref-followers" / h.name
                clients[h.name] = live.spawn(h.name, f"ref-{h.name}", [*node, "client",
                    "--servers", live.url(relay_of(h), PORT), "--version", "v1", "--workdir",
                    str(work), "--out", str(work / "model.safetensors"), "--deadline",
                    str(REF_DEADLINE_S), "--poll", str(POLL_S)],
                    log_dir=case_dir / "logs")  # fmt: skip
            # As for ours: every client started and polling before the broadcast.
            settle = time.monotonic() + 180
            while time.monotonic() < settle and not all(
                "waiting for version" in c.tail(5) for c in clients.values()
            ):
                time.sleep(0.2)
            time.sleep(2.0)
            t0 = time.time()
            go.touch()
            seconds: dict[str, float | None] = {}
            while len(seconds) < len(clients) and time.time() - t0 < REF_DEADLINE_S + 30:
                for name, p in clients.items():
                    if name not in seconds and not p.alive():
                        seconds[name] = (
                            round(time.time() - t0, 3) if p.proc.returncode == 0 else None
                        )
                time.sleep(0.2)
            for name, p in clients.items():
                seconds.setdefault(name, None)
                p.stop(timeout_s=5)
            truth = sha256(src)
            wrong = sum(
                1
                for h in hosts
                if seconds[h.name] is not None
                and sha256(case_dir / "ref-followers" / h.name / "model.safetensors") != truth
            )
            return Arrivals(seconds=seconds, wrong_installs=wrong, bytes=src.stat().st_size)
        finally:
            self.stop_all()
            for d in ["ref-followers", "ref-origin", *[f"ref-{r}" for r in relays]]:
                shutil.rmtree(case_dir / d, ignore_errors=True)
