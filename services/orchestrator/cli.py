"""`prime-orchestrator`: run the pool's front door."""

from __future__ import annotations

from prime_swarm.libs.cli import add_settings, fail, new_parser
from prime_swarm.libs.cli.lifecycle import hangup_as_terminate
from prime_swarm.libs.environments.determinism import check_environments
from prime_swarm.libs.environments.sandbox.interpreter import InterpreterError, require_tool_python

from .settings import OrchestratorSettings


def main(argv: list[str] | None = None) -> None:
    parser = new_parser(
        "prime-orchestrator",
        "Serve worker registration, heartbeats, leases and rollout intake.",
    )
    flags = add_settings(parser, OrchestratorSettings)
    settings = flags.load(parser.parse_args(argv))
    # An environment that is not deterministic turns honest work into `context_mismatch`: the
    # pool does not start on one (each environment played here and in a fresh process).
    try:  # the check below runs the environments' code in the sandbox
        if (pinned := settings.recipe.pinned_tool_python()) is not None:
            require_tool_python(pinned)
    except InterpreterError as exc:
        fail(parser.prog, str(exc))
    problem = check_environments((s.env, s.args) for s in settings.recipe.shares())
    if problem is not None:
        fail(parser.prog, problem)
    # The server stack is imported after the arguments are checked: `--help` answers at once.
    import uvicorn

    from prime_swarm.libs.observability.logs import setup_logging

    from .app import create_app

    setup_logging("orchestrator", settings.log_level)
    hangup_as_terminate()  # uvicorn stops gracefully on SIGTERM and Ctrl-C
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's loggers go through our handler, in our format
        access_log=False,
        # Open requests get 5 s to finish on SIGTERM, as the relay's (by default uvicorn waits
        # for every open connection: 15 s here, behind a retrying worker).
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
