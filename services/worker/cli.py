"""`prime-worker`: contribute compute to a pool.

  prime-worker join --pool 1 --rpc-url http://127.0.0.1:8545 --ledger 0x...
  prime-worker status --pool 1 ...     what is staked, attested and claimable, in ETH
  prime-worker leave / withdraw / claim --pool 1 ...

The key is an encrypted keystore (created on first use; `import-key` brings an existing one);
its passphrase comes from PRIME_WORKER_PASSPHRASE or a prompt.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

import httpx
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError, KeyFileError
from prime_swarm.libs.chain.units import eth
from prime_swarm.libs.cli import add_settings, fail, new_parser
from prime_swarm.libs.cli.lifecycle import on_stop_signals
from prime_swarm.libs.observability.http import serve_observability
from prime_swarm.libs.observability.logs import setup_logging

from .client import OrchestratorClient, OrchestratorError
from .keys import PASSPHRASE_ENV, import_existing, open_key
from .onboarding import JoinError, Standing, read_standing
from .settings import WorkerChainSettings, WorkerKeySettings, WorkerSettings
from .status_line import Snapshot

# Each command and the settings class its flags come from (a new command: one line here).
COMMANDS = {
    "join": (WorkerSettings, "check, stake, register and generate rollouts until Ctrl-C"),
    "status": (WorkerChainSettings, "this key's balance, stake, units and rewards in a pool"),
    "leave": (
        WorkerChainSettings,
        "leave a pool: the stake unbonds (stays slashable) for the pool's period",
    ),
    "withdraw": (WorkerChainSettings, "take back the stake once its unbonding has ended"),
    "claim": (WorkerChainSettings, "claim the rewards earned in a pool"),
    "address": (WorkerKeySettings, "print (and create) this worker's address"),
    "import-key": (WorkerKeySettings, "store an existing private key (read from stdin)"),
}


def stake_line(s: Standing, block: int) -> str:
    """Where the stake is, and what to do next with it."""
    if s.member:
        return f"staked {eth(s.stake)} (member; `prime-worker leave` starts unbonding)"
    if s.stake and s.unbonding_until > block:
        return (
            f"{eth(s.stake)} unbonding until block {s.unbonding_until} (now {block}); "
            "then `prime-worker withdraw`"
        )
    if s.stake:
        return f"{eth(s.stake)} unbonded: `prime-worker withdraw` pays it out"
    return f"not staked (minimum {eth(s.pool.min_stake)}; `prime-worker join`)"


def describe(s: Standing, block: int) -> str:
    """The contributor's position in a pool, with what to do next."""
    claim = " (`prime-worker claim`)" if s.rewards else ""
    return "\n".join(
        [
            f"{s.address} in pool {s.pool.pool_id}: balance {eth(s.balance)}",
            f"  {stake_line(s, block)}",
            f"  {s.units:,} units attested; rewards {eth(s.rewards)} claimable{claim}",
        ]
    )


def still_staked(s: Standing, block: int) -> str:
    """What Ctrl-C leaves behind, and how to get it back."""
    if not s.member:
        return stake_line(s, block)
    return (
        f"{eth(s.stake)} is still staked in pool {s.pool.pool_id} "
        f"({eth(s.rewards)} rewards claimable): `prime-worker leave --pool {s.pool.pool_id}` "
        "starts its unbonding, `prime-worker withdraw` then pays it out"
    )


def verdict_lines(s: Standing, ledger: LedgerClient) -> list[str]:
    """What the pool's validators decided about this worker and why, from the orchestrator's
    status API: each verdict that cost it (held, refused, slashed, ejected) with the statistic
    that decided and its limit, so an honest-stack problem reads apart from a cheat."""
    assert ledger.account is not None
    client = OrchestratorClient(s.pool.orchestrator_url, ledger.account, 10.0, 0)
    try:
        mine = client.worker_status(s.address).worker
    except (OrchestratorError, httpx.HTTPError):
        return ["  (the pool's orchestrator has no verdicts to show for this worker)"]
    finally:
        client.close()
    lines = [f"  {mine.accepted:,} accepted by the pool's validators"]
    for reason, count in sorted(mine.rejected.items()):
        why = mine.why.get(reason, "")
        lines.append(f"  {count:,} {reason}" + (f": {why}" if why else ""))
    if mine.ejected:
        lines.append(f"  ejected: {mine.ejection or 'no reason recorded'}")
    return lines


def chain_command(command: str, ledger: LedgerClient, settings: WorkerChainSettings) -> str:
    address = ledger.account.address if ledger.account else ""
    pool_id = settings.pool_id
    standing = read_standing(ledger, settings, address)
    block = ledger.block_number()
    if command == "status":
        return "\n".join([describe(standing, block), *verdict_lines(standing, ledger)])
    if command == "leave":
        if not standing.member:
            raise JoinError(stake_line(standing, block))
        left = ledger.leave(pool_id)
        return (
            f"left pool {pool_id}: {eth(left.stake)} unbonds until block {left.unbonding_until} "
            "(still slashable until then), then `prime-worker withdraw`"
        )
    if command == "withdraw":
        if standing.member or not standing.stake or standing.unbonding_until > block:
            raise JoinError(stake_line(standing, block))
        return f"withdrew {eth(ledger.withdraw(pool_id))} from pool {pool_id}"
    if not standing.rewards:  # claim
        raise JoinError(f"no rewards to claim in pool {pool_id} yet ({standing.units:,} units)")
    return f"claimed {eth(ledger.claim_rewards(pool_id))} from pool {pool_id}"


def ask(question: str) -> bool:
    if not sys.stdin.isatty():
        raise JoinError(f"{question} No terminal to ask in: pass --yes (PRIME_WORKER_YES=1)")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def main(argv: list[str] | None = None) -> None:
    parser = new_parser("prime-worker", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {}
    for name, (settings_cls, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        commands[name] = add_settings(p, settings_cls)
    args = parser.parse_args(argv)
    settings = commands[args.command].load(args)
    prog = f"prime-worker {args.command}"
    try:
        if args.command == "import-key":
            account = import_existing(settings.key_file)
        else:
            account = open_key(settings.key_file)
    except KeyFileError as exc:
        fail(prog, f"{exc} (--key-file, {PASSPHRASE_ENV})")
    if args.command in ("address", "import-key"):
        print(account.address)
        return
    assert isinstance(settings, WorkerChainSettings)
    ledger = LedgerClient(
        settings.rpc_url, settings.ledger_address, account, timeout=settings.chain_timeout_s
    )
    if args.command != "join":
        try:
            print(chain_command(args.command, ledger, settings))
        except (JoinError, ChainError) as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            sys.exit(1)
        return
    assert isinstance(settings, WorkerSettings)
    setup_logging("worker", settings.log_level)
    try:
        join(settings, account, ledger)
    except JoinError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # the second Ctrl-C: what is staked was printed on the way out
        sys.exit(130)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def join(settings: WorkerSettings, account: LocalAccount, ledger: LedgerClient) -> None:
    from prime_swarm.libs.model.hardware import detect, native_precision

    from .onboarding import (
        check_orchestrator,
        check_stack,
        check_trainer,
        rejoin,
        stake_if_needed,
    )

    say = print if sys.stderr.isatty() else (lambda *_a: None)
    try:
        hardware = detect(settings.device)
    except ValueError as exc:
        raise JoinError(f"--device {settings.device}: {exc}") from None
    # vLLM takes the GPU whenever one is visible, whatever --device says (it is hf's).
    where = "cuda" if settings.backend == "vllm" and _cuda_visible() else settings.device
    if settings.precision == "auto":
        settings = settings.model_copy(update={"precision": native_precision(where)})
    standing = read_standing(ledger, settings, account.address)
    say(f"worker {account.address}: balance {eth(standing.balance)}")
    say(f"hardware: {hardware.describe()}; backend {settings.backend} in {settings.precision}")
    trainer = check_trainer(standing.pool, settings)
    check_orchestrator(standing.pool, settings.http_timeout_s)
    say(f"pool {settings.pool_id}: orchestrator {standing.pool.orchestrator_url} answers")
    stack = check_stack(standing.pool, settings, where, account)
    stake_if_needed(ledger, standing, confirm=(lambda q: True) if settings.yes else ask)

    import torch

    torch.set_num_threads(settings.threads)
    from prime_swarm.libs.model.backend import make_backend
    from prime_swarm.libs.model.vllm_backend import VLLMBackendError

    from .runner import Worker
    from .status_line import StatusLine

    # The backend is chosen once, here, and injected: the worker never branches on its name.
    try:
        backend = make_backend(settings.backend, settings.precision)
    except VLLMBackendError as exc:
        raise JoinError(f"--backend {settings.backend}: {exc}") from None
    snapshot = Snapshot()
    worker = Worker(
        settings,
        account,
        backend,
        standing.pool.orchestrator_url,
        trainer,
        hardware.describe(),
        snapshot,
        rejoin=lambda: rejoin(ledger, settings, account.address),
        stack=stack,
    )
    install_stop(worker.stop)
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
    line = None
    if sys.stderr.isatty():
        refresh = status_refresher(worker.orchestrator_url, ledger, settings)
        line = StatusLine(snapshot, refresh=refresh)
        line.start()
    try:
        worker.run()
    except VLLMBackendError as exc:
        raise JoinError(f"--backend {settings.backend}: {exc}") from None
    finally:
        if line is not None:
            line.stop()
        if settings.unstake_on_exit:
            left = ledger.leave(settings.pool_id)
            print(
                f"left pool {settings.pool_id}: {eth(left.stake)} unbonds until block "
                f"{left.unbonding_until}, then `prime-worker withdraw`",
                file=sys.stderr,
            )
        else:
            try:
                standing = read_standing(ledger, settings, account.address)
                print(still_staked(standing, ledger.block_number()))
            except (JoinError, ChainError) as exc:
                print(f"stopped; the chain could not be read for the stake left: {exc}")


def install_stop(stop: threading.Event) -> None:
    """First Ctrl-C (or SIGTERM, SIGHUP): finish the batch in hand, then stop. A second Ctrl-C:
    stop now."""

    def request_stop(signum: int, _frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()
        print(
            "\nstopping after the batch in hand (Ctrl-C again to stop now) ...",
            file=sys.stderr,
        )

    on_stop_signals(request_stop)


def status_refresher(
    orchestrator_url: str, ledger: LedgerClient, settings: WorkerSettings
) -> Callable[[Snapshot], None]:
    """Reads the validators' verdicts (orchestrator status API) and the chain's units and
    rewards into the status line's snapshot."""
    assert ledger.account is not None
    address = ledger.account.address
    # A client of its own: the status line must never queue behind the worker's submissions.
    client = OrchestratorClient(orchestrator_url, ledger.account, settings.http_timeout_s, 0)

    def refresh(snapshot: Snapshot) -> None:
        try:
            mine = client.worker_status(address).worker
            snapshot.accepted, snapshot.rejected = mine.accepted, dict(mine.rejected)
        except OrchestratorError:  # not registered yet (404), or rate-limited: keep the last
            pass
        snapshot.units = ledger.work_units(settings.pool_id, address)
        snapshot.rewards_wei = ledger.reward_balance(settings.pool_id, address)

    return refresh


if __name__ == "__main__":
    main()
