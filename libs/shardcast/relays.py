"""Book-keeping of relay behaviour across requests: who is healthy, who is down, who lied."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Literal

# After this many errors in a row a relay is tried only when no healthy one is left.
DOWN_AFTER = 3
# Weight of the newest transfer in a relay's throughput average.
RATE_EWMA = 0.3

EventKind = Literal["ok", "miss", "error", "demoted"]
EventHook = Callable[[EventKind, str, str], None]


@dataclass
class RelayHealth:
    url: str
    shards_ok: int = 0
    bytes_ok: int = 0
    seconds_ok: float = 0.0
    misses: int = 0
    errors: int = 0
    consecutive_errors: int = 0
    demoted: str | None = None  # why, once the relay served bytes that failed verification
    in_flight: int = 0
    rate_bps: float = 0.0  # moving average of delivered bytes per second, 0 until measured

    @property
    def tier(self) -> int:
        """0 healthy, 1 down (transport errors), 2 demoted (integrity failure)."""
        if self.demoted is not None:
            return 2
        return 1 if self.consecutive_errors >= DOWN_AFTER else 0


class RelayPool:
    """Thread-safe view of a list of relays, shared by the manifest fetch and shard downloads.

    Keep one pool for the life of a worker so a relay demoted on version v stays demoted for v+1.
    A demoted relay is still a last resort: every byte is verified anyway, so using it can cost
    time but never integrity.
    """

    def __init__(self, relays: Iterable[str], on_event: EventHook | None = None) -> None:
        urls = list(dict.fromkeys(r.rstrip("/") for r in relays))
        if not urls:
            raise ValueError("at least one relay URL is needed")
        self._health = {u: RelayHealth(u) for u in urls}
        self._lock = threading.Lock()
        self._on_event = on_event

    @property
    def urls(self) -> list[str]:
        return list(self._health)

    def candidates(self, exclude: Iterable[str] = ()) -> list[str]:
        """Relays to try, best tier first, keeping the caller's order within a tier."""
        skip = set(exclude)
        with self._lock:
            ranked = sorted(self._health.values(), key=lambda h: h.tier)
            return [h.url for h in ranked if h.url not in skip]

    def pick(self, seq: int, exclude: Iterable[str] = ()) -> str | None:
        """The relay of the best tier expected to finish one more transfer soonest.

        Expected time is (transfers in flight + 1) / measured throughput; relays not measured yet
        count as fast as the fastest measured one, so each gets tried. Ties are spread by `seq`.
        None when every relay was excluded.
        """
        skip = set(exclude)
        with self._lock:
            tiers = sorted({h.tier for h in self._health.values() if h.url not in skip})
            if not tiers:
                return None
            best = [h for h in self._health.values() if h.tier == tiers[0] and h.url not in skip]
            fastest = max((h.rate_bps for h in best), default=0.0) or 1.0
            n = len(best)

            def cost(item: tuple[int, RelayHealth]) -> tuple[float, int]:
                i, h = item
                return ((h.in_flight + 1) / (h.rate_bps or fastest), (i - seq) % n)

            return min(enumerate(best), key=cost)[1].url

    def begin(self, url: str) -> None:
        with self._lock:
            self._health[url].in_flight += 1

    def end(self, url: str) -> None:
        with self._lock:
            h = self._health[url]
            h.in_flight = max(0, h.in_flight - 1)

    def record_ok(self, url: str, nbytes: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            h = self._health[url]
            h.shards_ok += 1
            h.bytes_ok += nbytes
            h.seconds_ok += seconds
            h.consecutive_errors = 0
            if seconds > 0 and nbytes > 0:
                rate = nbytes / seconds
                h.rate_bps = (
                    rate if h.rate_bps == 0 else RATE_EWMA * rate + (1 - RATE_EWMA) * h.rate_bps
                )
        self._emit("ok", url, "")

    def record_miss(self, url: str, reason: str = "not held") -> None:
        with self._lock:
            self._health[url].misses += 1
        self._emit("miss", url, reason)

    def record_error(self, url: str, reason: str) -> None:
        with self._lock:
            h = self._health[url]
            h.errors += 1
            h.consecutive_errors += 1
        self._emit("error", url, reason)

    def demote(self, url: str, reason: str) -> None:
        with self._lock:
            h = self._health[url]
            h.errors += 1
            if h.demoted is None:
                h.demoted = reason
        self._emit("demoted", url, reason)

    @property
    def demoted(self) -> dict[str, str]:
        """Relays caught serving bytes or manifests that failed verification, with the reason."""
        with self._lock:
            return {u: h.demoted for u, h in self._health.items() if h.demoted is not None}

    def report(self) -> dict[str, dict[str, object]]:
        with self._lock:
            return {u: asdict(h) for u, h in self._health.items()}

    def _emit(self, kind: EventKind, url: str, reason: str) -> None:
        if self._on_event is not None:
            self._on_event(kind, url, reason)


def as_pool(relays: Iterable[str] | RelayPool) -> RelayPool:
    return relays if isinstance(relays, RelayPool) else RelayPool(relays)
