"""`prime-relay fetch`: download and verify one policy version from relays, with a progress bar."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from prime_swarm.libs.shardcast import (
    NotAvailableError,
    RelayPool,
    ShardcastError,
    download_version,
    fetch_manifest,
    wait_for_manifest,
)
from prime_swarm.libs.shardcast.client import HeldFiles, make_http_client


class ProgressBar:
    """A dependency-free one-line progress bar (the relay image does not ship tqdm)."""

    def __init__(self, stream: TextIO, width: int = 30, min_interval_s: float = 0.1) -> None:
        self.stream = stream
        self.width = width
        self.min_interval_s = min_interval_s
        self._started = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        with self._lock:
            if done < total and now - self._last < self.min_interval_s:
                return
            self._last = now
            frac = done / total if total else 1.0
            filled = int(self.width * frac)
            rate = done / max(now - self._started, 1e-6) / 1e6
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (self.width - filled)}] {frac * 100:5.1f}% "
                f"{done / 1e6:9.1f}/{total / 1e6:.1f} MB {rate:7.1f} MB/s"
            )
            if done >= total:
                self.stream.write("\n")
            self.stream.flush()


def add_parser(modes: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    text = "download and verify a policy version from relays"
    p = modes.add_parser("fetch", help=text, description=text)
    p.add_argument(
        "--relay",
        dest="relays",
        action="append",
        required=True,
        metavar="URL",
        help="relay URL (repeat)",
    )
    p.add_argument(
        "--trainer", required=True, metavar="ADDRESS", help="trusted trainer address (0x...)"
    )
    p.add_argument(
        "--version",
        default="latest",
        metavar="N|latest",
        help="policy version number or 'latest' (default: latest)",
    )
    p.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="model directory to create"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="seconds to wait for the version to appear (default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="per-request timeout, s (default: %(default)s)",
    )
    p.add_argument("--deadline", type=float, metavar="SECONDS", help="whole download deadline, s")
    p.add_argument(
        "--workers",
        type=int,
        default=8,
        metavar="N",
        help="parallel shard transfers (default: %(default)s)",
    )
    p.add_argument(
        "--held",
        type=Path,
        metavar="DIR",
        help="a directory holding an earlier version (--held-version), fetched before: files "
        "it shares with the new version are linked, and deltas against it are used",
    )
    p.add_argument("--held-version", type=int, metavar="N", help="the version --held holds")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar on stderr"
    )


def run(args: argparse.Namespace) -> int:
    pool = RelayPool(args.relays)
    version: int | str = args.version if args.version == "latest" else int(args.version)
    progress = ProgressBar(sys.stderr) if args.progress else None
    http = make_http_client(args.timeout, max_connections=max(8, 2 * args.workers))
    started = time.monotonic()
    if (args.held is None) != (args.held_version is None):
        print("prime-relay fetch: --held and --held-version go together", file=sys.stderr)
        return 2
    try:
        held = None
        if args.held is not None:
            # The held version's own signed manifest says what its files are.
            old = fetch_manifest(pool, args.held_version, args.trainer, args.timeout, http=http)
            held = HeldFiles(args.held, old.manifest)
        manifest = None
        if isinstance(version, int) and args.wait > 0:
            print(
                f"waiting up to {args.wait:g}s for version {version}", file=sys.stderr, flush=True
            )
            manifest = wait_for_manifest(
                pool, version, args.trainer, wait_s=args.wait, timeout_s=args.timeout, http=http
            )
        out = download_version(
            pool,
            version,  # type: ignore[arg-type]
            args.out,
            args.trainer,
            timeout_s=args.timeout,
            deadline_s=args.deadline,
            max_workers=args.workers,
            progress=progress,
            manifest=manifest,
            overwrite=args.overwrite,
            held=held,
        )
    except (NotAvailableError, ShardcastError, FileExistsError, ValueError) as exc:
        print(f"prime-relay fetch: {exc}", file=sys.stderr)
        _report_demoted(pool)
        return 1
    finally:
        http.close()
    _report_demoted(pool)
    print(f"{out} ({time.monotonic() - started:.2f}s)")
    return 0


def _report_demoted(pool: RelayPool) -> None:
    for url, why in pool.demoted.items():
        print(f"prime-relay fetch: relay {url} demoted: {why}", file=sys.stderr)
