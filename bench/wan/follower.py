"""One follower of the time-to-N benchmark: a contributor's machine fetching one policy version.

It does what a worker's policy store does (libs/policy/store.py): wait for the signed manifest,
download and verify every shard (or every delta against the version it holds) from its relays,
install the directory, and, if the download fails (a relay killed, a region cut off), try again
with the same relay pool, which remembers who failed, until its deadline. It writes when it
finished (wall clock, comparable with the bench's t0) and what it went through.

    python -m bench.wan.follower --relay URL [--relay URL] --trainer 0x.. --version 2 \
        --out DIR [--held DIR --held-version 1] --deadline 900 --result FILE.json
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from prime_swarm.libs.shardcast import (
    NotAvailableError,
    RelayPool,
    ShardcastError,
    download_version,
    fetch_manifest,
    wait_for_manifest,
)
from prime_swarm.libs.shardcast.client import HeldFiles, make_http_client

RETRY_PAUSE_S = 1.0
# How often it asks for the manifest while the version is not out: a worker hears of a version
# from its heartbeat (every 2 s), not by polling relays. At 0.1 s, 64 followers' 640 requests a
# second took this 2-core machine whole before anything was published (the time-to-64 run's
# publish took 97 s instead of 3).
POLL_S = 1.0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--relay", dest="relays", action="append", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--held", type=Path)
    p.add_argument("--held-version", type=int)
    p.add_argument("--deadline", type=float, default=900.0)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--result", type=Path, required=True)
    a = p.parse_args()
    # The fetch library's one line per failed transfer attempt, in this follower's log.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    started = time.monotonic()
    pool = RelayPool(a.relays)
    # Started and imported: the bench publishes only once every follower says so.
    a.result.with_suffix(".ready").touch()
    cpu_at_ready = time.process_time()  # the interpreter's start is not the case's work
    http = make_http_client(a.timeout, max_connections=16)
    errors: list[str] = []
    attempts = 0
    done_at: float | None = None
    held = None
    while time.monotonic() - started < a.deadline:
        attempts += 1
        try:
            if a.held is not None and held is None:
                old = fetch_manifest(pool, a.held_version, a.trainer, a.timeout, http=http)
                held = HeldFiles(a.held, old.manifest)
            left = a.deadline - (time.monotonic() - started)
            manifest = wait_for_manifest(
                pool, a.version, a.trainer, wait_s=left, timeout_s=a.timeout, poll_s=POLL_S,
                http=http,
            )  # fmt: skip
            shutil.rmtree(a.out, ignore_errors=True)  # a failed attempt's leftovers
            download_version(
                pool,
                a.version,
                a.out,
                a.trainer,
                timeout_s=a.timeout,
                manifest=manifest,
                held=held,
                http=http,
            )
            done_at = time.time()
            break
        except (NotAvailableError, ShardcastError, OSError) as exc:
            errors.append(f"{time.monotonic() - started:.1f}s {type(exc).__name__}: {exc}"[:300])
            time.sleep(RETRY_PAUSE_S)
    http.close()
    a.result.write_text(
        json.dumps(
            {
                "done_at": done_at,
                "attempts": attempts,
                # This machine's CPU is shared by every follower: what one cost once ready, to
                # tell a link-bound case from a CPU-bound one.
                "cpu_s": round(time.process_time() - cpu_at_ready, 3),
                "errors": errors,
                "relays": pool.report(),
                "demoted": pool.demoted,
            }
        )
    )
    return 0 if done_at is not None else 1


if __name__ == "__main__":
    sys.exit(main())
