"""`prime-relay origin|relay|fetch`: one binary, two server modes and a client."""

from __future__ import annotations

import argparse
import logging
import sys

from prime_swarm.libs.cli import add_settings, new_parser
from prime_swarm.libs.cli.lifecycle import hangup_as_terminate

from . import fetch_cli
from .settings import RelaySettings

USAGE = """examples:
  prime-relay origin --port 8700 --data-dir /data/origin --trainer 0xTRAINER
  prime-relay relay  --port 8701 --data-dir /data/relay1 --parent http://127.0.0.1:8700 \\
                     --trainer 0xTRAINER
  prime-relay fetch  --relay http://127.0.0.1:8701 --trainer 0xTRAINER --version 3 --out model/"""

# The fields each server mode has no flag for: `mode` is the subcommand itself.
HIDDEN = {
    "origin": ("mode", "parents", "poll_interval_s", "pull_workers"),
    "relay": ("mode", "max_manifest_bytes"),
}
# Spellings of earlier releases, still accepted (hidden from --help).
KEEP_ALIVE_S = 30
OLD_FLAGS = {"request_timeout_s": ["timeout"], "poll_interval_s": ["poll-interval"]}


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(
        "prime-relay", "SHARDCAST origin/relay for Prime Swarm policy versions.", epilog=USAGE
    )
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    for mode, help_text in (
        ("origin", "accept signed uploads from the trainer and serve them"),
        ("relay", "pull versions from parent(s) and serve them"),
    ):
        p = modes.add_parser(mode, help=help_text, description=help_text)
        p.set_defaults(
            settings_flags=add_settings(p, RelaySettings, hide=HIDDEN[mode], aliases=OLD_FLAGS)
        )
    fetch_cli.add_parser(modes)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.mode == "fetch":
        return fetch_cli.run(ns)
    settings = vars(ns).pop("settings_flags").load(ns, mode=ns.mode)
    # Imported here: `fetch` is a client and should start fast without the server stack.
    import uvicorn

    from prime_swarm.libs.observability.logs import setup_logging

    from .app import create_app

    setup_logging("relay", settings.log_level, mode=settings.mode, port=settings.port)
    if settings.access_log:  # setup_logging quietens per-request lines; asked for, show them
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    logging.getLogger(__name__).info("starting", extra={"host": settings.host})
    hangup_as_terminate()  # uvicorn stops gracefully on SIGTERM and Ctrl-C
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # uvicorn's loggers go through our handler, in our format
        access_log=settings.access_log,
        timeout_graceful_shutdown=5,
        # Well above a client's keep-alive expiry (httpx: 5 s) plus a wide-area round trip.
        # At uvicorn's default (5 s) the two expired together: a client reused a connection the
        # relay was closing ("Server disconnected without sending a response"), which failed a
        # publish in the time-to-64 run and killed the trainer in the first pool run across the
        # regions. Idle connections cost a file descriptor each; keeping them saves a handshake
        # (a 90-250 ms round trip) per reuse.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
