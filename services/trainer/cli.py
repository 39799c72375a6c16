"""`prime-trainer`: consume verified rollouts, train, publish each version."""

from __future__ import annotations

import argparse
import signal
import sys

import torch

from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.protocol.keys import load_or_create_key

from .settings import TrainerSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prime-trainer",
        description="Asynchronous GRPO trainer. Settings come from PRIME_TRAINER_* variables; "
        "flags override them.",
    )
    parser.add_argument("--redis-url")
    parser.add_argument("--origin-url")
    parser.add_argument("--key-file")
    parser.add_argument("--init-model-dir")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--progress-file")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--groups-per-step", type=int)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    try:
        settings = TrainerSettings(**{k: v for k, v in vars(args).items() if v is not None})
    except Exception as exc:
        parser.error(str(exc))
    log = setup_logging("trainer", settings.log_level)
    torch.set_num_threads(settings.threads)
    # SIGTERM from a launcher or orchestrator of processes: exit between steps, via SystemExit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from prime_swarm.libs.rl.distributed import close_distributed, init_distributed

    from .follower import follow
    from .loop import Trainer  # torch-heavy imports after argument errors are reported

    # Under torchrun every rank runs this; rank 0 is the trainer, the others its FSDP2 peers.
    ctx = init_distributed(init_method=settings.dist_init_method)
    if not ctx.is_main:
        try:
            follow(settings, ctx)
        finally:
            close_distributed(ctx)
        return
    trainer = Trainer(settings, load_or_create_key(settings.key_file), ctx)
    if settings.metrics_port:
        serve_observability(
            settings.metrics_host,
            settings.metrics_port,
            lambda: {"service": "trainer", "step": trainer.step},
        )
    try:
        trainer.run()
    except KeyboardInterrupt:
        log.info("interrupted")
    finally:
        close_distributed(ctx)


if __name__ == "__main__":
    main()
