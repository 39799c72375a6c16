"""The trainer's side for the benchmark: sign and upload one checkpoint to our origin.

publish_ours.py --origin URL --model-dir DIR --version 1   (key in SC_BENCH_KEY)
    [--parent-version 0 --parent-dir DIR]   (also offer deltas against that version)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from eth_account import Account

from prime_swarm.libs.shardcast import publish_version


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--origin", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--shard-size", type=int, default=16 * 1024 * 1024)
    p.add_argument("--parent-version", type=int, default=None)
    p.add_argument("--parent-dir", default=None)
    args = p.parse_args()
    account = Account.from_key(os.environ["SC_BENCH_KEY"])
    # The wall-clock start of the publish itself, after this process's imports: a trainer
    # publishes from a running process (bench/shardcast/delta.py times from here).
    print(f"publish starts at {time.time():.6f}", flush=True)
    started = time.monotonic()
    publish_version(
        args.origin,
        args.model_dir,
        args.version,
        args.parent_version,
        account,
        args.shard_size,
        timeout=60.0,
        parent_dir=args.parent_dir,
    )
    print(f"published in {time.monotonic() - started:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
