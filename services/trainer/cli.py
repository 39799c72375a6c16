"""`prime-trainer`: consume verified rollouts, train, publish each version."""

from __future__ import annotations

import sys

from prime_swarm.libs.chain.keyfile import load_or_create_key
from prime_swarm.libs.cli import add_settings, new_parser
from prime_swarm.libs.cli.lifecycle import on_termination
from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.libs.streams.connection import exit_when_redis_is_gone

from .settings import TrainerSettings


def main(argv: list[str] | None = None) -> None:
    parser = new_parser("prime-trainer", "Asynchronous GRPO trainer.")
    flags = add_settings(parser, TrainerSettings)
    settings = flags.load(parser.parse_args(argv))
    log = setup_logging("trainer", settings.log_level)
    import torch  # after the arguments are checked: `--help` answers at once

    torch.set_num_threads(settings.threads)
    # SIGTERM (a launcher, `docker stop`) or SIGHUP (a closed terminal): exit between steps,
    # via SystemExit; Ctrl-C raises KeyboardInterrupt, handled below.
    on_termination(lambda *_: sys.exit(0))
    from prime_swarm.libs.rl.distributed import close_distributed, init_distributed

    from .follower import follow
    from .loop import Trainer  # torch-heavy imports after argument errors are reported

    # Under torchrun every rank runs this; rank 0 is the trainer, the others its FSDP2 peers.
    ctx = init_distributed(init_method=settings.dist_init_method)
    finished = False
    if not ctx.is_main:
        try:
            follow(settings, ctx)
            finished = True
        finally:
            close_distributed(ctx, finished)
        return
    try:
        with exit_when_redis_is_gone("prime-trainer"):
            trainer = Trainer(settings, load_or_create_key(settings.key_file), ctx)
            if settings.metrics_port:
                serve_observability(
                    settings.metrics_host,
                    settings.metrics_port,
                    lambda: {"service": "trainer", "step": trainer.step},
                )
            trainer.run()
        finished = True
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        close_distributed(ctx, finished)


if __name__ == "__main__":
    main()
