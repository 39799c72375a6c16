"""`prime-relay origin|relay ...`: one binary, two modes."""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from . import fetch_cli
from .settings import RelaySettings

USAGE = """examples:
  prime-relay origin --port 8700 --data-dir /data/origin --trainer 0xTRAINER
  prime-relay relay  --port 8701 --data-dir /data/relay1 --parent http://127.0.0.1:8700 \\
                     --trainer 0xTRAINER
  prime-relay fetch  --relay http://127.0.0.1:8701 --trainer 0xTRAINER --version 3 --out model/
Every flag may also come from PRIME_RELAY_<FIELD> (e.g. PRIME_RELAY_KEEP_VERSIONS=4)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prime-relay",
        description="SHARDCAST origin/relay for Prime Swarm policy versions.",
        epilog=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(dest="mode", required=True)
    for mode, help_text in (
        ("origin", "accept signed uploads from the trainer and serve them"),
        ("relay", "pull versions from parent(s) and serve them"),
    ):
        p = modes.add_parser(mode, help=help_text)
        # default=None everywhere: only flags actually given override the environment.
        p.add_argument("--host", default=None)
        p.add_argument("--port", type=int, default=None)
        p.add_argument("--data-dir", dest="data_dir", default=None)
        p.add_argument(
            "--trainer",
            dest="trusted_trainer",
            default=None,
            help="trusted trainer address (0x...)",
        )
        p.add_argument("--keep-versions", dest="keep_versions", type=int, default=None)
        p.add_argument(
            "--timeout",
            dest="request_timeout_s",
            type=float,
            default=None,
            help="per-request timeout in seconds",
        )
        p.add_argument("--log-level", dest="log_level", default=None)
        p.add_argument("--access-log", dest="access_log", action="store_true", default=None)
        if mode == "relay":
            p.add_argument(
                "--parent",
                dest="parents",
                action="append",
                default=None,
                help="parent base URL (origin or relay); repeat for several",
            )
            p.add_argument("--poll-interval", dest="poll_interval_s", type=float, default=None)
            p.add_argument("--pull-workers", dest="pull_workers", type=int, default=None)
    fetch_cli.add_parser(modes)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.mode == "fetch":
        return fetch_cli.run(ns)
    args = vars(ns)
    overrides = {k: v for k, v in args.items() if v is not None}
    try:
        settings = RelaySettings(**overrides)
    except ValidationError as exc:
        print(f"prime-relay: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    # Imported here: `fetch` is a client and should start fast without the server stack.
    import uvicorn

    from prime_swarm.libs.observability.logs import setup_logging

    from .app import create_app

    setup_logging("relay", settings.log_level, mode=settings.mode, port=settings.port)
    logging.getLogger(__name__).info("starting", extra={"host": settings.host})
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep our JSON handler on the root logger
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
