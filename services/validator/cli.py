"""`prime-validator`: check every rollout, attest good work and slash bad work."""

from __future__ import annotations

import argparse
import signal
import threading

import torch

from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.protocol.keys import load_key

from .settings import ValidatorSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prime-validator",
        description="Validate submitted rollouts. Settings come from PRIME_VALIDATOR_* "
        "variables; flags override them.",
    )
    parser.add_argument("--redis-url")
    parser.add_argument("--rpc-url")
    parser.add_argument("--ledger-address")
    parser.add_argument("--pool-id", type=int)
    parser.add_argument("--key-file")
    parser.add_argument("--trusted-trainer")
    parser.add_argument("--relay", action="append", dest="relays")
    parser.add_argument("--cache-dir")
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    try:
        settings = ValidatorSettings(**{k: v for k, v in vars(args).items() if v is not None})
        account = load_key(settings.key_file)
    except Exception as exc:
        parser.error(str(exc))
    setup_logging("validator", settings.log_level)
    torch.set_num_threads(settings.threads)
    from .loop import Validator

    try:
        validator = Validator(settings, account)
    except ChainError as exc:
        parser.exit(2, f"prime-validator: {exc}\n")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if settings.metrics_port:
        serve_observability(
            settings.metrics_host,
            settings.metrics_port,
            lambda: {"service": "validator", "verdicts": dict(validator.counts)},
        )
    validator.run(stop)
    # Leave nothing owed on chain when asked to stop.
    validator.drain_chain_queue()


if __name__ == "__main__":
    main()
