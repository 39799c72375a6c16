"""A user-space TCP link emulator: delay, jitter, partitions and resets between regions.

This kernel has no `tc netem`, so every connection between testbed hosts goes through this
forwarder in the hub namespace (bandwidth is still shaped by `tc tbf` on each host's veth). A
client connects to `hub_ip:listen_port`; its source IP names its region, the route names the
target's, and every byte is held for the one-way delay between the two. Faults come from a small
JSON state file that every forwarder process polls, so several processes sharing the listeners
(SO_REUSEPORT, to spread the CPU over cores) all see the same partition or reset.

Run: `python -m prime_swarm.deploy.testbed.link CONFIG.json` (stops on SIGTERM, SIGINT, SIGHUP).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Coroutine, Iterable
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prime_swarm.libs.cli.lifecycle import on_stop_signals

CHUNK = 256 * 1024  # large reads: the per-chunk Python work is then negligible per byte
POLL_S = 0.05
COALESCE_S = 0.010
STATS_S = 1.0
RESET_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on with 0 s: close() sends RST


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is a bad config, not a default


class Route(_Strict):
    listen_host: str
    listen_port: int = Field(ge=1, le=65535)
    target_host: str
    target_port: int = Field(ge=1, le=65535)
    target_region: str
    name: str


class RegionLink(_Strict):
    """The link between regions `a` and `b` (either way round; a == b is within a region).
    `jitter_ms` spreads each one-way delay uniformly by +-jitter."""

    a: str
    b: str
    rtt_ms: float = Field(ge=0)
    jitter_ms: float = Field(ge=0)


class LinkConfig(_Strict):
    routes: list[Route]
    regions_by_ip: dict[str, str]  # an IP not listed (the bench's control host): no delay, no cut
    links: list[RegionLink]
    window_bytes: int = Field(default=4 << 20, gt=0)  # in flight per direction per connection
    state_file: Path

    @model_validator(mode="after")
    def _every_usable_pair_has_a_link(self) -> LinkConfig:
        """Every (client region, target region) a connection can take, checked at load time:
        a missing link found on the first connection would fail mid-run instead."""
        known = {frozenset((link.a, link.b)) for link in self.links}
        targets = {route.target_region for route in self.routes}
        missing = {
            "-".join(sorted((src, dst)))
            for src in set(self.regions_by_ip.values())
            for dst in targets
            if frozenset((src, dst)) not in known
        }
        if missing:
            raise ValueError(f"no link for region pair(s): {', '.join(sorted(missing))}")
        return self


def one_way(cfg: LinkConfig, src_region: str, dst_region: str) -> tuple[float, float]:
    """(base delay, jitter) in seconds one way between two regions, in either direction."""
    for link in cfg.links:
        if {link.a, link.b} == {src_region, dst_region}:
            return link.rtt_ms / 2000, link.jitter_ms / 1000
    raise ValueError(f"no link between regions {src_region} and {dst_region}")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a poller in another process never reads a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_state(
    path: Path,
    cut: Iterable[str] = (),
    reset_epoch: int = 0,
    reset_regions: list[str] | None = None,
) -> None:
    """The faults every forwarder process applies within POLL_S: regions partitioned from the
    others, and a reset of the open connections of `reset_regions` (all: None) whenever
    `reset_epoch` grows."""
    state = {"cut": sorted(cut), "reset_epoch": reset_epoch, "reset_regions": reset_regions}
    _write_json(path, state)


class Faults:
    """The state file as this process last read it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cut: frozenset[str] = frozenset()
        self.epoch = 0
        self.reset_regions: list[str] | None = None
        self._seen: tuple[int, int, int] | None = None
        self._changed = asyncio.Event()

    def poll(self) -> bool:
        """Read the file if it changed; True when a reset is due (the epoch grew)."""
        try:
            st = os.stat(self.path)
            seen: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen == self._seen:
                return False
            state = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            seen, state = None, {}
        except (OSError, ValueError):
            return False  # unreadable for now: keep the last good state
        if not isinstance(state, dict):
            return False
        self._seen = seen
        if (cut := frozenset(state.get("cut") or ())) != self.cut:
            self.cut = cut
            self._changed.set()  # wakes every held connection to look again
            self._changed = asyncio.Event()
        epoch = int(state.get("reset_epoch") or 0)
        due, self.epoch = epoch > self.epoch, max(epoch, self.epoch)
        self.reset_regions = state.get("reset_regions")
        return due

    def blocked(self, src: str | None, dst: str) -> bool:
        return src is not None and src != dst and (src in self.cut or dst in self.cut)

    async def wait_open(self, src: str | None, dst: str) -> None:
        """Until the path is not cut: a blackholed path hangs both ends, as the real one would,
        and what was held flows on healing, as TCP's retransmissions would deliver it."""
        while self.blocked(src, dst):
            await self._changed.wait()


class _Pipe:
    """One direction of a connection: bytes read now, written base +- jitter later, in order.

    At most `window` bytes wait here unwritten: the reader stops at that cap and the sender's
    socket buffers fill up behind it. That is what bounds one connection to window/delay bytes
    per second, as a TCP window does across a long round trip; without it a sender would push
    everything into this process at loopback speed and only the delivery would be late.
    """

    def __init__(self, conn: _Conn, key: str, not_before: float = 0.0) -> None:
        self.conn, self.key, self.not_before = conn, key, not_before
        self.queue: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue()
        self.held = 0
        self.room = asyncio.Event()
        self.last = 0.0

    async def pump_in(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        loop, conn, window = asyncio.get_running_loop(), self.conn, self.conn.window
        while True:
            while self.held >= window:
                self.room.clear()
                await self.room.wait()
            chunk = await reader.read(min(CHUNK, window - self.held))
            if 0 < len(chunk) < CHUNK // 4 and isinstance(transport, asyncio.ReadTransport):
                # A flow through a shaped link arrives a packet or two per wake-up, and each
                # wake-up costs this process more than the bytes do (4.3 CPU-s per GB forwarded
                # at 25 Mbit/s per flow, 0.85 for one loopback flow). Not reading for COALESCE_S
                # lets the kernel gather them into one read. Cost: a byte may be read up to
                # COALESCE_S late, which only a flow that sends again within that time sees.
                transport.pause_reading()
                await asyncio.sleep(COALESCE_S)
                transport.resume_reading()
            delay = max(0.0, conn.base + random.uniform(-conn.jitter, conn.jitter))
            # Never before the previous chunk: jitter must not reorder a byte stream.
            self.last = max(self.last, max(loop.time(), self.not_before) + delay)
            self.held += len(chunk)
            self.queue.put_nowait((chunk, self.last))
            if not chunk:  # EOF, forwarded after the data before it
                return

    async def pump_out(self, writer: asyncio.StreamWriter) -> None:
        loop, conn, stats = asyncio.get_running_loop(), self.conn, self.conn.fwd.stats
        while True:
            chunk, at = await self.queue.get()
            if (wait := at - loop.time()) > 0:
                await asyncio.sleep(wait)
            await conn.fwd.faults.wait_open(conn.src, conn.dst)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()
            self.held -= len(chunk)
            self.room.set()
            stats[self.key] += len(chunk)


class _Conn:
    """One client connection and, after the emulated handshake, its upstream connection."""

    def __init__(self, fwd: _Forwarder, route: Route, client: asyncio.StreamWriter) -> None:
        self.fwd, self.route, self.window = fwd, route, fwd.cfg.window_bytes
        peer = client.get_extra_info("peername")
        src = fwd.cfg.regions_by_ip.get(peer[0]) if peer else None
        self.src, self.dst = src, route.target_region
        # An unlisted IP is the control host: never delayed.
        self.base, self.jitter = (0.0, 0.0) if src is None else one_way(fwd.cfg, src, self.dst)
        self.writers = [client]
        self.task = asyncio.current_task()

    def touches(self, regions: list[str] | None) -> bool:
        return regions is None or self.src in regions or self.dst in regions

    def reset(self) -> None:
        """Both sockets closed with RST: the peers see a connection reset, not an EOF."""
        for writer in self.writers:
            with suppress(OSError):  # already closed
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_LINGER)
            writer.transport.abort()

    async def run(self, client_reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        # TCP's handshake: the client's first bytes cannot leave before one round trip, and the
        # target hears of the connection only then; what the client sends meanwhile is kept.
        handshake = 2 * self.base
        up = _Pipe(self, "bytes_up", not_before=loop.time() + handshake)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(up.pump_in(client_reader, self.writers[0].transport))
                await asyncio.sleep(handshake)
                await self.fwd.faults.wait_open(self.src, self.dst)
                reader, writer = await asyncio.open_connection(
                    self.route.target_host, self.route.target_port, limit=CHUNK
                )
                self.writers.append(writer)
                down = _Pipe(self, "bytes_down")
                tasks.create_task(up.pump_out(writer))
                tasks.create_task(down.pump_in(reader, writer.transport))
                tasks.create_task(down.pump_out(self.writers[0]))
        except* OSError:  # refused, reset, broken pipe: one side's error closes both sides
            self.reset()
        finally:
            for writer in self.writers:
                writer.close()


class _Forwarder:
    def __init__(self, cfg: LinkConfig) -> None:
        self.cfg = cfg
        self.faults = Faults(cfg.state_file)
        self.conns: set[_Conn] = set()
        self.stats = {"bytes_up": 0, "bytes_down": 0, "connections": 0}

    async def handle(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = _Conn(self, route, writer)
        self.conns.add(conn)
        self.stats["connections"] += 1
        try:
            await conn.run(reader)
        except asyncio.CancelledError:
            pass  # only stop and reset cancel it; 3.11's asyncio.streams logs a cancelled handler
        finally:
            self.conns.discard(conn)

    def reset(self, regions: list[str] | None) -> None:
        for conn in [c for c in self.conns if c.touches(regions)]:
            conn.reset()
            if conn.task is not None:
                conn.task.cancel()

    def write_stats(self) -> None:
        """Counters for measuring this process itself (its CPU per byte forwarded)."""
        s = self.stats
        data = {"bytes": s["bytes_up"] + s["bytes_down"], **s, "cpu_s": time.process_time()}
        with suppress(OSError):  # counters are for measuring; forwarding goes on without them
            _write_json(Path(f"{self.cfg.state_file}.stats.{os.getpid()}.json"), data)

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        next_stats = loop.time() + STATS_S
        while True:
            if self.faults.poll():
                self.reset(self.faults.reset_regions)
            if loop.time() >= next_stats:
                self.write_stats()
                next_stats += STATS_S
            await asyncio.sleep(POLL_S)


async def serve(cfg: LinkConfig, stop: asyncio.Event) -> None:
    """Forward every route until `stop` is set; then close the listeners and all connections."""
    fwd = _Forwarder(cfg)
    fwd.faults.poll()  # the state found at start is the baseline: only later resets count
    servers: list[asyncio.Server] = []
    watcher = asyncio.create_task(fwd.watch())
    try:
        for route in cfg.routes:
            servers.append(
                await asyncio.start_server(
                    partial(fwd.handle, route),
                    route.listen_host,
                    route.listen_port,
                    reuse_port=True,  # several processes share a port; the kernel spreads conns
                    limit=CHUNK,
                )
            )
        await stop.wait()
    finally:
        for server in servers:
            server.close()
        watcher.cancel()
        tasks = [c.task for c in fwd.conns if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(watcher, *tasks, return_exceptions=True)
        fwd.write_stats()


def load_config(path: Path) -> LinkConfig:
    return LinkConfig.model_validate_json(path.read_bytes())


def _one_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where + ': ' if where else ''}{first['msg']}{more}"
    return " ".join(str(exc).split())


async def _serve_until_signalled(cfg: LinkConfig) -> None:
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    on_stop_signals(lambda *_: loop.call_soon_threadsafe(stop.set))
    await serve(cfg, stop)


def _run(main: Coroutine[Any, Any, None]) -> None:
    """On uvloop where installed (uvicorn's standard extra brings it): 2.6 CPU-s per GB
    forwarded against asyncio's 3.1 for 32 paced flows through one process (a one-off
    measurement; `make bench-wan` reports the emulator's CPU per GB in every run)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m prime_swarm.deploy.testbed.link CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = load_config(Path(args[0]))
    except (OSError, ValueError) as exc:
        print(f"link: bad config {args[0]}: {_one_line(exc)}", file=sys.stderr)
        return 2
    try:
        _run(_serve_until_signalled(cfg))
    except OSError as exc:  # a listen address taken or missing
        print(f"link: {_one_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
