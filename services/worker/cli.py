"""`prime-worker`: contribute compute to a pool.

prime-worker join --pool 1 --rpc-url http://127.0.0.1:8545 --ledger 0x...
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import get_args

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging
from prime_swarm.protocol.keys import KeyFileError, load_or_create_key
from prime_swarm.protocol.messages import BackendName

from .settings import WorkerSettings


def _settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> WorkerSettings:
    overrides = {
        "pool_id": args.pool,
        "rpc_url": args.rpc_url,
        "ledger_address": args.ledger,
        "key_file": args.key_file,
        "cache_dir": getattr(args, "cache_dir", None),
        "max_rollouts": getattr(args, "max_rollouts", None),
        "unstake_on_exit": True if getattr(args, "unstake_on_exit", False) else None,
        "progress": False if getattr(args, "no_progress", False) else None,
        "backend": getattr(args, "backend", None),
        "device": getattr(args, "device", None),
        "precision": getattr(args, "precision", None),
        "trainer": getattr(args, "trainer", None),
    }
    try:
        return WorkerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:
        parser.error(str(exc))


def unstake(ledger: LedgerClient, command: str, pool_id: int, address: str) -> str:
    """Leave (start unbonding) or withdraw; returns the line to show the contributor."""
    if command == "leave":
        left = ledger.leave(pool_id)
        return (
            f"{address} left pool {pool_id}; {left.stake} wei unbond until block "
            f"{left.unbonding_until} (still slashable until then), then run `prime-worker withdraw`"
        )
    until, now = ledger.unbonding_until(pool_id, address), ledger.block_number()
    if until > now:
        return f"{address}: stake in pool {pool_id} unbonds until block {until} (now {now})"
    return f"{address} withdrew {ledger.withdraw(pool_id)} wei from pool {pool_id}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="prime-worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("join", "stake, register and generate rollouts until Ctrl-C"),
        ("leave", "leave a pool: the stake unbonds (stays slashable) for the pool's period"),
        ("withdraw", "take back the stake once its unbonding has ended"),
        ("address", "print (and create) this worker's address"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--pool", type=int, help="on-chain pool id (PRIME_WORKER_POOL_ID)")
        p.add_argument("--rpc-url", help="chain JSON-RPC URL (PRIME_WORKER_RPC_URL)")
        p.add_argument("--ledger", help="ledger contract address (PRIME_WORKER_LEDGER_ADDRESS)")
        p.add_argument("--key-file", type=Path, help="key file, created if missing")
        if name == "join":
            p.add_argument("--cache-dir", type=Path)
            p.add_argument("--max-rollouts", type=int)
            p.add_argument("--unstake-on-exit", action="store_true")
            p.add_argument("--no-progress", action="store_true")
            p.add_argument(
                "--backend",
                choices=get_args(BackendName),
                help="generation engine: hf (transformers) or vllm (PRIME_WORKER_BACKEND)",
            )
            p.add_argument("--device", help="cpu, cuda or cuda:N (PRIME_WORKER_DEVICE)")
            p.add_argument(
                "--trainer",
                help="pin the trainer's signing address; default: the pool's record on chain "
                "(PRIME_WORKER_TRAINER)",
            )
            p.add_argument(
                "--precision",
                choices=["bf16", "fp16", "fp32"],
                help="compute precision, declared with every submission (PRIME_WORKER_PRECISION)",
            )
    args = parser.parse_args(argv)

    if args.command == "address":
        key_file = args.key_file or WorkerSettings.model_fields["key_file"].default
        print(load_or_create_key(key_file).address)
        return
    settings = _settings(parser, args)
    log = setup_logging("worker", settings.log_level)
    try:
        account = load_or_create_key(settings.key_file)
    except KeyFileError as exc:
        parser.exit(2, f"prime-worker: {exc}\n")
    if args.command in ("leave", "withdraw"):
        ledger = LedgerClient(
            settings.rpc_url, settings.ledger_address, account, timeout=settings.chain_timeout_s
        )
        try:
            print(unstake(ledger, args.command, settings.pool_id, account.address))
        except ChainError as exc:
            parser.exit(1, f"prime-worker {args.command}: {exc}\n")
        return
    import torch

    torch.set_num_threads(settings.threads)
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        parser.exit(2, f"prime-worker: --device {settings.device}: no CUDA device is visible\n")
    from prime_swarm.libs.model.backend import make_backend
    from prime_swarm.libs.model.vllm_backend import VLLMBackendError

    from .runner import JoinError, Worker

    # The backend is chosen once, here, and injected: the worker never branches on its name.
    try:
        backend = make_backend(settings.backend, settings.precision)
    except VLLMBackendError as exc:
        parser.exit(2, f"prime-worker: --backend {settings.backend}: {exc}\n")
    worker = Worker(settings, account, backend)

    # Ctrl-C / SIGTERM: finish the rollout in hand, then stop (and unstake if asked).
    def request_stop(*_: object) -> None:
        worker.stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    if settings.metrics_port:
        serve_observability(
            settings.metrics_host,
            settings.metrics_port,
            lambda: {
                "service": "worker",
                "address": account.address,
                "submitted": worker.submitted,
                "refused": worker.refused,
            },
        )
    try:
        worker.run()
    except (JoinError, VLLMBackendError) as exc:
        log.error(str(exc))
        print(f"prime-worker: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
