"""The testbed brought up for real: a network namespace per host, one shaped veth each into a hub
namespace, the link emulator in the hub, and a teardown that leaves nothing behind.

Layout. The hub namespace holds a bridge (`br0`, the hub's address ends in .255.254) and the
link emulator (link.py). Each host's veth has `tc tbf` on both ends: the host's end shapes its
upload, the hub's end its download. Bandwidth is the kernel's; delay is not (no netem here), so
hosts never talk to each other's addresses: every service a host serves (`ports`) gets a route,
a port on the hub's address, and the emulator forwards it with the round trip between the two
regions. The caller's own control link into the bridge is unshaped and undelayed: health checks
and readings never queue behind the traffic they measure.

Nothing may outlive a run, even a SIGKILLed one: a janitor process holds a pipe from the
testbed's owner and, at its end of file (however the owner died), kills every process left in
the testbed's namespaces and deletes them; `teardown(tag)` does the same on demand.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from prime_swarm.libs.localnet.process import ManagedProcess

from .link import LinkConfig, write_state
from .topology import Host, Testbed

FIRST_ROUTE_PORT = 20000
ROOT = Path(__file__).resolve().parents[2]
LINK_PROCESSES = 2  # the emulator's processes share its listeners (SO_REUSEPORT): both cores


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(f"{tag}-")]


def kill_namespace_processes(ns: str) -> None:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    for pid in out.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def teardown(tag: str) -> None:
    """Every process in the tag's namespaces killed, the namespaces (and so their veths) and
    the control link deleted. Safe to call when nothing is there."""
    found = namespaces(tag)
    for ns in found:
        kill_namespace_processes(ns)
    for ns in found:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", f"{tag}-ctl"], capture_output=True, timeout=30)


def available() -> str | None:
    """None if namespaces, veths and tbf can be made here, else why not."""
    tag = "wprobe"
    try:
        teardown(tag)
        _run("ip", "netns", "add", f"{tag}-0")
        _run("ip", "-n", f"{tag}-0", "link", "add", "wpa", "type", "veth", "peer", "name", "wpb")
        _run("tc", "-n", f"{tag}-0", "qdisc", "add", "dev", "wpa", "root", "tbf", "rate", "10mbit",
             "burst", "64kb", "limit", "128kb")  # fmt: skip
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces, veth or tc tbf unavailable: {str(exc)[:200]}"
    finally:
        teardown(tag)
    return None


def _tbf(mbit: float) -> list[str]:
    """tbf arguments for `mbit`: a burst of at least one timer tick's worth at that rate (the
    kernel refills per tick) and a queue of 50 ms, beyond which the sender is pushed back."""
    rate_bytes = mbit * 1e6 / 8
    burst = max(64 << 10, int(rate_bytes / 100))
    limit = max(2 * burst, int(rate_bytes * 0.05))
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "limit", str(limit)]


class LiveTestbed:
    """`up()` builds it, `down()` removes it; processes are placed on hosts with `spawn`."""

    def __init__(self, bed: Testbed, work: Path) -> None:
        self.bed, self.work = bed, Path(work)
        self.hosts = {h.name: h for h in bed.expand()}
        self.hub_ip = f"{bed.subnet}.255.254"
        self.control_ip = f"{bed.subnet}.255.253"
        self.state_file = self.work / "link-state.json"
        self._routes: dict[tuple[str, int], int] = {}
        port = FIRST_ROUTE_PORT
        for h in self.hosts.values():
            for p in h.ports:
                self._routes[(h.name, p)] = port
                port += 1
        self._janitor: subprocess.Popen[bytes] | None = None
        self._tag_lock: TextIO | None = None
        self._links: list[ManagedProcess] = []
        self._epoch = 0
        self._cut: set[str] = set()
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- addresses
    def ns(self, host: str) -> str:
        return f"{self.bed.tag}-{self.hosts[host].index}"

    def ip(self, host: str) -> str:
        return self.hosts[host].ip(self.bed.subnet)

    def addr(self, host: str, port: int) -> tuple[str, int]:
        """Where anyone reaches `port` of `host`: its route on the hub, through the links."""
        try:
            return self.hub_ip, self._routes[(host, port)]
        except KeyError:
            raise KeyError(f"host {host!r} serves no port {port} (add it to its `ports`)") from None

    def url(self, host: str, port: int, scheme: str = "http") -> str:
        ip, p = self.addr(host, port)
        return f"{scheme}://{ip}:{p}"

    def in_group(self, group: str) -> list[Host]:
        return [h for h in self.hosts.values() if h.group == group]

    # ----------------------------------------------------------------- up / down
    def up(self) -> LiveTestbed:
        tag = self.bed.tag
        self._lock_tag()
        try:
            self._build(tag)
        except BaseException:
            self.down()
            raise
        return self

    def _build(self, tag: str) -> None:
        teardown(tag)  # what a killed run may have left (its janitor normally got it)
        self.work.mkdir(parents=True, exist_ok=True)
        self._start_janitor()
        hub = f"{tag}-hub"
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "addr", "add", f"{self.hub_ip}/16", "dev", "br0")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for h in self.hosts.values():
            self._add_host(h, hub)
        # The control link: this process's own way in, unshaped.
        ctl, peer = f"{tag}-ctl", f"{tag}-ctlp"
        _run("ip", "link", "add", ctl, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", hub)
        _run("ip", "-n", hub, "link", "set", peer, "master", "br0")
        _run("ip", "-n", hub, "link", "set", peer, "up")
        _run("ip", "addr", "add", f"{self.control_ip}/16", "dev", ctl)
        _run("ip", "link", "set", ctl, "up")
        self._start_links(hub)

    def _add_host(self, h: Host, hub: str) -> None:
        ns, a, b = self.ns(h.name), f"{self.bed.tag}{h.index}h", f"{self.bed.tag}{h.index}b"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        _run("ip", "link", "set", a, "netns", ns, "name", "eth0")
        _run("ip", "link", "set", b, "netns", hub)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.ip(h.name)}/16", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", hub, "link", "set", b, "master", "br0")
        _run("ip", "-n", hub, "link", "set", b, "up")
        _run("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *_tbf(h.up_mbit))
        _run("tc", "-n", hub, "qdisc", "add", "dev", b, "root", *_tbf(h.down_mbit))

    def link_config(self) -> LinkConfig:
        regions = sorted(self.bed.regions)
        links = []
        for i, a in enumerate(regions):
            for b in regions[i:]:
                rtt, jitter = self.bed.rtt(a, b)
                links.append({"a": a, "b": b, "rtt_ms": rtt, "jitter_ms": jitter})
        routes = [
            {
                "name": f"{host}:{port}",
                "listen_host": self.hub_ip,
                "listen_port": listen,
                "target_host": self.ip(host),
                "target_port": port,
                "target_region": self.hosts[host].region,
            }
            for (host, port), listen in self._routes.items()
        ]
        return LinkConfig.model_validate(
            {
                "routes": routes,
                "regions_by_ip": {self.ip(n): h.region for n, h in self.hosts.items()},
                "links": links,
                "window_bytes": self.bed.window_bytes,
                "state_file": str(self.state_file),
            }
        )

    def _start_links(self, hub: str) -> None:
        config = self.work / "links.json"
        config.write_text(self.link_config().model_dump_json(indent=1))
        write_state(self.state_file)
        argv = ["ip", "netns", "exec", hub, sys.executable, "-m", "prime_swarm.deploy.testbed.link"]
        for i in range(LINK_PROCESSES):
            self._links.append(
                ManagedProcess(
                    f"link-{i}", [*argv, str(config)], self.work / "logs", cwd=Path.cwd()
                )
            )
        if self._routes:
            host, port = next(iter(self._routes))
            ip, p = self.addr(host, port)

            # Listening is all that is checked: nothing serves behind the route yet.
            def listening() -> bool:
                with socket.create_connection((ip, p), timeout=1):
                    return True

            for proc in self._links:
                proc.wait_until(listening, 15.0, "forwarding")

    def _lock_tag(self) -> None:
        """One live testbed per tag: a second `up` would tear the first one down under its
        owner. The lock passes to the janitor, so it holds until the cleanup is done."""
        path = Path(tempfile.gettempdir()) / f"prime-swarm-testbed-{self.bed.tag}.lock"
        self._tag_lock = open(path, "w")  # noqa: SIM115 (held for the testbed's life)
        try:
            fcntl.flock(self._tag_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._tag_lock.close()
            self._tag_lock = None
            raise RuntimeError(
                f"testbed {self.bed.tag!r} is already up (another process holds {path}); "
                f"if it was left over: prime-swarm testbed down --tag {self.bed.tag}"
            ) from None

    def _start_janitor(self) -> None:
        self._janitor = subprocess.Popen(
            [sys.executable, "-m", "prime_swarm.deploy.testbed.janitor", self.bed.tag],
            stdin=subprocess.PIPE,
            start_new_session=True,  # outlives a Ctrl-C to the owner's process group
            cwd=Path.cwd(),
            # It holds the tag's lock until it has cleaned up.
            pass_fds=[self._tag_lock.fileno()] if self._tag_lock else [],
        )

    def down(self) -> None:
        for p in self._links:
            p.stop(timeout_s=5)
        teardown(self.bed.tag)
        if self._janitor is not None:
            assert self._janitor.stdin is not None
            self._janitor.stdin.close()  # nothing left for it to do; it exits at EOF
            self._janitor.wait(30)
            self._janitor = None
        if self._tag_lock is not None:
            self._tag_lock.close()
            self._tag_lock = None

    def __enter__(self) -> LiveTestbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ----------------------------------------------------------------- processes
    def spawn(
        self,
        host: str,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> ManagedProcess:
        """`argv` started inside `host`'s namespace (it binds there; others reach it by `url`)."""
        return ManagedProcess(
            name,
            ["ip", "netns", "exec", self.ns(host), *argv],
            log_dir or self.work / "logs",
            env=env,
            cwd=Path.cwd(),
        )

    # ----------------------------------------------------------------- faults
    def cut(self, region: str) -> None:
        with self._lock:
            self._cut.add(region)
            self._write_state(None)

    def heal(self, region: str) -> None:
        with self._lock:
            self._cut.discard(region)
            self._write_state(None)

    def reset(self, region: str | None = None) -> None:
        """Every open connection to or from `region` (all, if None) reset."""
        with self._lock:
            self._epoch += 1
            self._write_state([region] if region else None)

    def _write_state(self, reset_regions: list[str] | None) -> None:
        write_state(self.state_file, sorted(self._cut), self._epoch, reset_regions)

    def kill_host(self, host: str) -> None:
        """Every process on `host` SIGKILLed: a machine lost."""
        kill_namespace_processes(self.ns(host))

    def run_faults(self, on_fault: Callable[[str], None] = lambda _: None) -> threading.Thread:
        """Apply the file's fault schedule from now, in a daemon thread (returned)."""
        start = time.monotonic()
        events: list[tuple[float, str, Callable[[], None]]] = []
        for f in self.bed.faults:
            if f.kind == "kill":
                events.append((f.at_s, f"kill {f.host}", lambda h=f.host: self.kill_host(h)))
            elif f.kind == "reset":
                events.append(
                    (f.at_s, f"reset {f.region or 'all'}", lambda r=f.region: self.reset(r))
                )
            else:
                assert f.region and f.for_s
                events.append((f.at_s, f"cut {f.region}", lambda r=f.region: self.cut(r)))
                events.append(
                    (f.at_s + f.for_s, f"heal {f.region}", lambda r=f.region: self.heal(r))
                )
        events.sort(key=lambda e: e[0])

        def apply() -> None:
            for at, what, action in events:
                time.sleep(max(0.0, start + at - time.monotonic()))
                action()
                on_fault(what)

        thread = threading.Thread(target=apply, name="faults", daemon=True)
        thread.start()
        return thread

    # ----------------------------------------------------------------- the emulator's own cost
    def link_stats(self) -> dict[str, float]:
        """Bytes forwarded and CPU-seconds spent by the emulator's processes so far."""
        total = {"bytes": 0.0, "connections": 0.0, "cpu_s": 0.0}
        for f in self.state_file.parent.glob(f"{self.state_file.name}.stats.*.json"):
            try:
                s = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            for k in total:
                total[k] += float(s.get(k, 0))
        return total
