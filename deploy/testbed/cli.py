"""`prime-swarm testbed up FILE` and `prime-swarm testbed down --tag TAG`.

`up` builds the testbed the file describes, prints each host's namespace and address and each
route (where a service of a host is reached through the links), applies the file's fault
schedule with `--faults`, and holds until Ctrl-C (or SIGTERM), then removes everything. Run a
process on a host with `ip netns exec <namespace> ...`. `down` removes what a testbed of that
tag left (normally nothing: a janitor cleans up after an `up` that was killed).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from .net import LiveTestbed, available, teardown
from .topology import Testbed


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="testbed_command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="build the testbed a TOML file describes and hold it")
    up.add_argument("file", type=Path, help="the testbed (e.g. bench/wan/three_regions.toml)")
    up.add_argument("--faults", action="store_true", help="apply the file's fault schedule")
    up.add_argument("--work", type=Path, help="folder for the emulator's files and logs")
    down = sub.add_parser("down", help="remove every namespace and process of a testbed")
    down.add_argument("--tag", required=True, help="the testbed's tag (its `tag` key)")


def run(args: argparse.Namespace, fail: Callable[[str], NoReturn]) -> None:
    if args.testbed_command == "down":
        teardown(args.tag)
        print(f"testbed {args.tag!r}: nothing left")
        return
    try:
        bed = Testbed.load(args.file)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        fail(f"{args.file}: {where + ': ' if where else ''}{first['msg']}")
    except (OSError, ValueError) as exc:  # unreadable, or not TOML
        fail(f"{args.file}: {exc}")
    if why := available():
        fail(why)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"testbed-{bed.tag}-"))
    live = LiveTestbed(bed, work)
    try:
        live.up()
        print(f"testbed {bed.name!r} up (tag {bed.tag}); emulator files in {work}")
        for name, h in live.hosts.items():
            print(f"  {name:<24} {live.ns(name):<10} {live.ip(name):<14} {h.region:<10} "
                  f"up {h.up_mbit:g} / down {h.down_mbit:g} Mbit/s")  # fmt: skip
            for port in h.ports:
                print(f"    :{port} -> {live.url(name, port)}")
        if args.faults:
            live.run_faults(lambda what: print(f"fault: {what}", flush=True))
        print("Ctrl-C to take it down", flush=True)
        while True:
            time.sleep(3600)
    finally:
        live.down()
        print(f"testbed {bed.tag!r} down")
