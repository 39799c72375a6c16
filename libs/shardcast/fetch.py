"""Parallel shard download with per-shard retry budgets, relay rotation and verification.

The same engine feeds a worker's model directory (client.py) and a relay's store (sync.py); only
the sink differs. Sinks verify every byte (see verify.py), so a relay that lies is caught here.

Three things keep a download moving when relays misbehave:

- every transfer has its own deadline (a trickling relay is cut off and the shard resumed
  elsewhere), every shard a bounded number of attempts, and the whole download an optional
  deadline; an attempt cut off after it moved the shard forward by `PROGRESS_CREDIT` is given
  back, so a relay that keeps delivering on a flaky path is not counted as one that delivers
  nothing;
- a transfer cut off mid-shard keeps the verified-so-far prefix and resumes with an HTTP Range
  request on the next relay (shards are content-addressed, so any relay's bytes fit);
- requests ask the relay to wait a little (`?wait=`) for a shard it is still pulling itself, so
  a client can start on a version while it is still travelling down the tree (cut-through).
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from prime_swarm.protocol.messages import FileEntry, ShardInfo

from . import routes
from .errors import IntegrityError, NotAvailableError, ShardcastError
from .relays import RelayPool
from .transport import (
    FetchOptions,
    MissingShard,
    RelayRefused,
    ShardTransport,
    TransportError,
    check_framing,
)

# Pause between full rounds over every relay (e.g. all relays still pulling the version).
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 2.0
# Slowest link tolerated (all of a download's transfers together) before a transfer is cut off
# and resumed elsewhere. A transfer's own floor is this shared by the transfers in flight: on
# a 25 Mbit/s home link, 8 transfers get ~390 KB/s each, and a floor of 512 KiB/s per transfer
# cut every 16 MiB shard off at its deadline and resumed it (bench/wan: 7 cut-offs in one
# follower's 17 shards over the wide-area testbed).
MIN_RATE_BPS = 512 * 1024
# New bytes an attempt must bring for it not to count against the shard's attempts. On the
# wide-area testbed (64 followers, bench/wan) a relay whose own pull was cut off cut its
# followers off with it, three times within one 16 MiB shard while each attempt had brought
# megabytes: the shard "failed in 3 attempts", the whole 272 MB download was thrown away and
# started over, and the slowest follower arrived at 419 s instead of ~110 s. The budget stays
# bounded: each given-back attempt brought a MiB more of a shard that cannot exceed its size
# (a reset, after a bad hash or an ignored Range, is an attempt that is never given back).
PROGRESS_CREDIT = 1 << 20
# A transfer under its share of MIN_RATE_BPS for this long is cut and resumed (curl's
# --speed-limit/--speed-time). Without it a transfer starved among its siblings on a
# tail-drop home link, still bringing bytes often enough for the read timeout, held its shard
# until the transfer deadline: 271 s for a 16 MiB shard at 8 transfers, one follower in 64
# arriving 210 s after the rest (bench/wan, 10 Mbit/s links). A new connection starts with
# a fresh congestion window; the cut attempt's progress is given back (PROGRESS_CREDIT).
LOW_SPEED_WINDOW_S = 30.0

log = logging.getLogger(__name__)


class ShardSink(Protocol):
    """Where a shard's bytes go. `received` bytes are kept across attempts (Range resume)."""

    @property
    def received(self) -> int: ...
    def write(self, chunk: bytes | memoryview) -> None: ...
    def reset(self) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


@dataclass(frozen=True)
class ShardTask:
    file: FileEntry
    shard: ShardInfo


SinkFactory = Callable[[ShardTask], ShardSink]


class _DeadlinePassed(ShardcastError):
    """A transfer ran past its own deadline: a trickling relay, cut off to resume elsewhere."""


class _TooSlow(_DeadlinePassed):
    """A transfer under its floor for LOW_SPEED_WINDOW_S: cut off to resume on a new connection."""


class Cancelled(ShardcastError):
    pass


def default_attempts(pool: RelayPool) -> int:
    return max(3, 2 * len(pool.urls))


def transfer_deadline(shard: ShardInfo, opts: FetchOptions) -> float:
    """Seconds one attempt at `shard` may take: the wait, a timeout, and the minimum rate of
    one of `max_workers` transfers sharing the slowest link tolerated."""
    return opts.wait_s + opts.timeout_s + shard.size * opts.max_workers / MIN_RATE_BPS


def low_speed_floor_bps(opts: FetchOptions) -> float:
    """The least a transfer must average over LOW_SPEED_WINDOW_S: its share of MIN_RATE_BPS."""
    return MIN_RATE_BPS / max(1, opts.max_workers)


def fetch_shard(
    transport: ShardTransport,
    relay: str,
    version: int,
    task: ShardTask,
    sink: ShardSink,
    opts: FetchOptions,
    deadline: float | None = None,
) -> None:
    """GET one shard (or its missing tail) from one relay into `sink`, then commit it.

    Raises unless the shard arrived intact. A failure mid-transfer leaves the verified prefix in
    the sink so the next attempt can resume with a Range request.
    """
    url = routes.join(relay, routes.shard_path(version, task.file.name, task.shard.index))
    if opts.wait_s > 0:
        url += f"?wait={opts.wait_s:g}"
    size = task.shard.size
    start = sink.received
    if start < size or size == 0:
        # identity: compression only costs CPU on incompressible weights (and breaks Range).
        headers = {"Accept-Encoding": "identity"}
        if 0 < start < size:
            headers["Range"] = f"bytes={start}-"

        def on_response(status: int, resp_headers: http.client.HTTPMessage) -> int:
            body = check_framing(status, resp_headers, size, start, "Range" in headers)
            if body.start == 0 and start:
                sink.reset()  # the relay ignored the Range: take the whole shard again
            return body.length

        floor = low_speed_floor_bps(opts) * LOW_SPEED_WINDOW_S
        window = [time.monotonic(), 0]  # start of the current low-speed window, bytes in it

        def on_chunk(chunk: memoryview) -> None:
            sink.write(chunk)
            now = time.monotonic()
            # Socket timeouts bound each read, not the transfer: a trickling relay needs this.
            if deadline is not None and now > deadline:
                raise _DeadlinePassed("transfer deadline passed mid-shard")
            window[1] += len(chunk)
            if now - window[0] >= LOW_SPEED_WINDOW_S:
                if window[1] < floor:
                    raise _TooSlow(
                        f"{window[1]} bytes in {now - window[0]:.0f} s, under "
                        f"{low_speed_floor_bps(opts):.0f} B/s"
                    )
                window[:] = [now, 0]

        transport.get(url, headers, on_response, on_chunk, opts.timeout_s + opts.wait_s)
    sink.commit()


def fetch_all(
    transport: ShardTransport,
    pool: RelayPool,
    version: int,
    tasks: Sequence[ShardTask],
    sink_factory: SinkFactory,
    opts: FetchOptions,
    *,
    on_shard_done: Callable[[ShardTask], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Fetch every task; raise NotAvailableError as soon as one shard exhausts its budget.

    `opts.deadline` bounds the whole call; each transfer is also bounded on its own (see
    `transfer_deadline`). `opts.wait_s` asks relays to hold a request for a shard in flight.
    """
    if not tasks:
        return
    attempts = opts.attempts_per_shard or default_attempts(pool)
    abort = stop if stop is not None else threading.Event()
    # A private event lets a failure stop sibling threads without setting the caller's event.
    failed = threading.Event()

    def cancelled() -> bool:
        return abort.is_set() or failed.is_set()

    def run(seq: int, task: ShardTask) -> None:
        try:
            _fetch_with_retries(
                transport, pool, version, seq, task, sink_factory, opts, attempts, cancelled
            )
        except BaseException:
            failed.set()
            raise
        if on_shard_done is not None:
            on_shard_done(task)

    with ThreadPoolExecutor(max_workers=max(1, min(opts.max_workers, len(tasks)))) as ex:
        futures = [ex.submit(run, seq, t) for seq, t in enumerate(tasks)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            f.cancel()
    errors = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception()]
    if errors:
        # Report the root cause, not the Cancelled of the siblings it stopped.
        real = [e for e in errors if not isinstance(e, Cancelled)]
        raise (real or errors)[0]


def _fetch_with_retries(
    transport: ShardTransport,
    pool: RelayPool,
    version: int,
    seq: int,
    task: ShardTask,
    sink_factory: SinkFactory,
    opts: FetchOptions,
    attempts: int,
    cancelled: Callable[[], bool],
) -> None:
    deadline = opts.deadline
    tried: set[str] = set()
    rounds = 0
    reasons: list[str] = []
    sink: ShardSink | None = None
    # Relays whose bytes are in the sink: a bad hash is blamed on one only if it sent them all.
    sources: set[str] = set()
    try:
        left, made = attempts, 0
        while left > 0:
            left, made = left - 1, made + 1
            relay = pool.pick(seq, exclude=tried)
            if relay is None:
                # Every relay failed this shard once: wait a little (they may still be pulling).
                rounds += 1
                tried.clear()
                pause = min(BACKOFF_FIRST_S * 2 ** (rounds - 1), BACKOFF_MAX_S)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                time.sleep(pause)
                relay = pool.pick(seq, exclude=tried)
                assert relay is not None
            if cancelled():
                raise Cancelled("download cancelled")
            now = time.monotonic()
            if deadline is not None and now > deadline:
                break
            tried.add(relay)
            if sink is None:
                sink = sink_factory(task)
            before = sink.received
            limit = now + transfer_deadline(task.shard, opts)
            if deadline is not None:
                limit = min(limit, deadline)
            pool.begin(relay)
            try:
                if before == 0:
                    sources.clear()
                sources.add(relay)
                fetch_shard(transport, relay, version, task, sink, opts, limit)
            except IntegrityError as exc:
                if sources == {relay}:
                    pool.demote(relay, f"{task.file.name}#{task.shard.index}: {exc}")
                else:  # bytes from several relays: cannot tell who lied, so start clean
                    pool.record_error(relay, f"mixed-source shard failed verification: {exc}")
                sink.reset()
                sources.clear()
                reasons.append(f"{relay}: {exc}")
            except MissingShard as exc:
                pool.record_miss(relay, str(exc))
                reasons.append(f"{relay}: {exc}")
            except (RelayRefused, TransportError, _DeadlinePassed) as exc:
                pool.record_error(relay, f"{type(exc).__name__}: {exc}")
                reasons.append(f"{relay}: {type(exc).__name__}: {exc}")
                moved = sink.received - before
                if moved >= PROGRESS_CREDIT:
                    left += 1  # cut off, but it moved the shard forward: not a wasted attempt
                # What a slow or stuck download did, in the worker's log (one line an attempt).
                log.warning(
                    "shard %s#%d from %s: %s: %s after %.1f s, %d bytes",
                    task.file.name, task.shard.index, relay, type(exc).__name__, exc,
                    time.monotonic() - now, moved,
                )  # fmt: skip
            else:
                pool.record_ok(relay, task.shard.size - before, time.monotonic() - now)
                sink = None  # committed: nothing to abort
                return
            finally:
                pool.end(relay)
                if sink is not None and sink.received == 0:
                    sources.discard(relay)
        raise NotAvailableError(
            f"{task.file.name} shard {task.shard.index} of version {version}: no relay delivered "
            f"it in {made} attempts (last: {'; '.join(reasons[-3:]) or 'deadline passed'})"
        )
    finally:
        if sink is not None:
            sink.abort()
