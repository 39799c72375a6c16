"""`prime-orchestrator`: run the pool's front door."""

from __future__ import annotations

import argparse

import uvicorn

from prime_swarm.libs.observability.logs import setup_logging

from .app import create_app
from .settings import OrchestratorSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prime-orchestrator",
        description="Serve worker registration, heartbeats, leases and rollout intake. "
        "Every setting can also come from PRIME_ORCH_* environment variables.",
    )
    parser.add_argument("--port", type=int)
    parser.add_argument("--host")
    parser.add_argument("--redis-url")
    parser.add_argument("--rpc-url")
    parser.add_argument("--ledger-address")
    parser.add_argument("--pool-id", type=int)
    parser.add_argument("--relay", action="append", dest="relays", help="relay URL (repeat)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = OrchestratorSettings(**overrides)
    except Exception as exc:  # pydantic ValidationError: show which setting is wrong
        parser.error(str(exc))
    setup_logging("orchestrator", settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


if __name__ == "__main__":
    main()
