"""Parallel shard download with per-shard retry budgets, relay rotation and verification.

The same engine feeds a worker's model directory (client.py) and a relay's store (sync.py); only
the sink differs. Sinks verify every byte (see verify.py), so a relay that lies is caught here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

import httpx

from prime_swarm.protocol.messages import FileEntry, ShardInfo

from . import routes
from .errors import IntegrityError, NotAvailableError, ShardcastError, ShardHashError
from .relays import RelayPool

STREAM_CHUNK = 1024 * 1024
# Pause between full rounds over every relay (e.g. all relays still pulling the version).
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 2.0


class ShardSink(Protocol):
    def write(self, chunk: bytes) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


@dataclass(frozen=True)
class ShardTask:
    file: FileEntry
    shard: ShardInfo


SinkFactory = Callable[[ShardTask], ShardSink]


class _Missing(ShardcastError):
    """The relay does not hold this shard (yet): try elsewhere, no blame."""


class _RelayFailed(ShardcastError):
    """The relay answered with an error status: count it against the relay's health."""


class Cancelled(ShardcastError):
    pass


def default_attempts(pool: RelayPool) -> int:
    return max(3, 2 * len(pool.urls))


def fetch_shard(
    http: httpx.Client,
    relay: str,
    version: int,
    task: ShardTask,
    sink: ShardSink,
    deadline: float | None = None,
) -> None:
    """GET one shard from one relay into `sink`; raises unless it arrived intact and committed."""
    url = routes.join(relay, routes.shard_path(version, task.file.name, task.shard.index))
    # identity: compression only costs CPU on incompressible weights (decoded anyway if used).
    with http.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
        if resp.status_code in (404, 410):
            raise _Missing(f"HTTP {resp.status_code}")
        if resp.status_code != 200:
            raise _RelayFailed(f"HTTP {resp.status_code}")
        declared = resp.headers.get("content-length")
        encoded = resp.headers.get("content-encoding", "identity") != "identity"
        if declared is not None and not encoded and declared.strip() != str(task.shard.size):
            raise ShardHashError(f"Content-Length {declared} but the shard is {task.shard.size}")
        for chunk in resp.iter_bytes(STREAM_CHUNK):
            sink.write(chunk)
            # httpx timeouts bound each read, not the transfer: a trickling relay needs this.
            if deadline is not None and time.monotonic() > deadline:
                raise _RelayFailed("download deadline passed mid-shard")
    sink.commit()


def fetch_all(
    http: httpx.Client,
    pool: RelayPool,
    version: int,
    tasks: Sequence[ShardTask],
    sink_factory: SinkFactory,
    *,
    attempts_per_shard: int | None = None,
    deadline: float | None = None,
    max_workers: int = 8,
    on_shard_done: Callable[[ShardTask], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Fetch every task; raise NotAvailableError as soon as one shard exhausts its budget."""
    if not tasks:
        return
    attempts = attempts_per_shard or default_attempts(pool)
    abort = stop if stop is not None else threading.Event()
    # A private event lets a failure stop sibling threads without setting the caller's event.
    failed = threading.Event()

    def cancelled() -> bool:
        return abort.is_set() or failed.is_set()

    def run(seq: int, task: ShardTask) -> None:
        try:
            _fetch_with_retries(
                http, pool, version, seq, task, sink_factory, attempts, deadline, cancelled
            )
        except BaseException:
            failed.set()
            raise
        if on_shard_done is not None:
            on_shard_done(task)

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(tasks)))) as ex:
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
    http: httpx.Client,
    pool: RelayPool,
    version: int,
    seq: int,
    task: ShardTask,
    sink_factory: SinkFactory,
    attempts: int,
    deadline: float | None,
    cancelled: Callable[[], bool],
) -> None:
    tried: set[str] = set()
    rounds = 0
    reasons: list[str] = []
    for _ in range(attempts):
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
        if deadline is not None and time.monotonic() > deadline:
            break
        tried.add(relay)
        sink = sink_factory(task)
        started = time.monotonic()
        try:
            fetch_shard(http, relay, version, task, sink, deadline)
        except IntegrityError as exc:
            pool.demote(relay, f"{task.file.name}#{task.shard.index}: {exc}")
            reasons.append(f"{relay}: {exc}")
        except _Missing as exc:
            pool.record_miss(relay, str(exc))
            reasons.append(f"{relay}: {exc}")
        except (_RelayFailed, httpx.HTTPError) as exc:
            pool.record_error(relay, f"{type(exc).__name__}: {exc}")
            reasons.append(f"{relay}: {type(exc).__name__}: {exc}")
        else:
            pool.record_ok(relay, task.shard.size, time.monotonic() - started)
            return
        finally:
            sink.abort()
    raise NotAvailableError(
        f"{task.file.name} shard {task.shard.index} of version {version}: no relay delivered it "
        f"in {attempts} attempts (last: {'; '.join(reasons[-3:]) or 'deadline passed'})"
    )
