"""`prime-validator`: check every rollout, attest good work and slash bad work."""

from __future__ import annotations

import sys
import threading

from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.chain.keyfile import KeyFileError, load_key
from prime_swarm.libs.cli import add_settings, fail, new_parser
from prime_swarm.libs.cli.lifecycle import on_stop_signals
from prime_swarm.libs.environments.sandbox.interpreter import InterpreterError, require_tool_python
from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.libs.streams.connection import exit_when_redis_is_gone

from .settings import ValidatorSettings

PROG = "prime-validator"


def main(argv: list[str] | None = None) -> None:
    parser = new_parser(PROG, "Validate submitted rollouts: attest good work, slash bad work.")
    flags = add_settings(parser, ValidatorSettings)
    settings = flags.load(parser.parse_args(argv))
    try:
        account = load_key(settings.key_file)
    except (KeyFileError, OSError) as exc:
        fail(PROG, f"--key-file: {exc}")
    if (pinned := settings.recipe.pinned_tool_python()) is not None:
        try:
            require_tool_python(pinned)
        except InterpreterError as exc:
            fail(PROG, str(exc))
    setup_logging("validator", settings.log_level)
    import torch  # after the arguments are checked: `--help` answers at once

    torch.set_num_threads(settings.threads)
    from .loop import Validator

    with exit_when_redis_is_gone(PROG):
        try:
            validator = Validator(settings, account)
        except ChainError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            sys.exit(2)
        stop = threading.Event()
        on_stop_signals(lambda *_: stop.set())  # queued attestations are flushed first
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
