"""`prime-chain`: compile, deploy and administer the ledger from the command line.

The operator's shell over `libs/chain` (the client, deployment records, keys, units): arguments
in, one library call, a result out.

Machine-readable results go to stdout (a pool id, a JSON document); everything else to stderr.
Bad input exits non-zero with one line naming the problem, never a traceback. web3 and
eth-account take over a second to import, so only the commands that talk to a chain pay for them:
`--help` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from eth_utils import is_address, to_checksum_address

from prime_swarm.libs.chain.deployment import (
    DEFAULT_CHALLENGE_BLOCKS,
    DEFAULT_SLASH_BPS,
    DEFAULT_UNBONDING_BLOCKS,
    load_deployment,
)
from prime_swarm.libs.chain.errors import ChainError, KeyFileError
from prime_swarm.libs.chain.units import eth, parse_wei
from prime_swarm.libs.cli import new_parser

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from prime_swarm.libs.chain.client import LedgerClient

PRIVATE_KEY_ENV = "PRIME_CHAIN_PRIVATE_KEY"


# --- argument types ---------------------------------------------------------------------------


AMOUNT_HELP = "wei, or a number with gwei or ether (0.5ether)"


def amount(text: str) -> int:
    """Wei from '1000', '2gwei' or '0.5ether' (`libs/chain/units.parse_wei`), as argparse wants
    a bad value reported."""
    try:
        return parse_wei(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pool_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid pool id {text!r} (a positive integer)")
    return int(text)


def address(text: str) -> str:
    if not is_address(text):
        raise argparse.ArgumentTypeError(f"invalid address {text!r}")
    return to_checksum_address(text)


def bps(text: str) -> int:
    if not text.isdigit() or int(text) > 10_000:
        raise argparse.ArgumentTypeError(f"invalid basis points {text!r} (0..10000)")
    return int(text)


def blocks(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid block count {text!r} (an integer >= 0)")
    return int(text)


# --- shared options ---------------------------------------------------------------------------


def _add_key_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("signing key (one of)")
    g.add_argument("--key-file", help="JSON key file; created (mode 0600) if missing")
    g.add_argument(
        "--private-key",
        help=f"hex private key (prefer ${PRIVATE_KEY_ENV}: arguments are visible to other users)",
    )
    g.add_argument(
        "--dev-account",
        type=int,
        metavar="INDEX",
        help="anvil dev account INDEX (public keys: local chains only)",
    )


def _add_deployment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deployment", required=True, help="deployment JSON written by `deploy`")
    p.add_argument("--rpc-url", help="override the deployment's RPC URL")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="receipt timeout, s (default: %(default)s)"
    )


def _account(args: argparse.Namespace) -> LocalAccount:
    private_key = args.private_key or os.environ.get(PRIVATE_KEY_ENV, "").strip() or None
    given = [x is not None for x in (args.key_file, private_key, args.dev_account)]
    if sum(given) != 1:
        raise ChainError(
            f"give exactly one of --key-file, --private-key (or ${PRIVATE_KEY_ENV}), --dev-account"
        )
    if args.dev_account is not None and args.dev_account < 0:
        raise ChainError("--dev-account must be >= 0")

    from eth_account import Account

    from prime_swarm.libs.chain.anvil import dev_accounts
    from prime_swarm.libs.chain.keyfile import load_or_create_key

    if args.key_file:
        return load_or_create_key(args.key_file)
    if private_key:
        try:
            return Account.from_key(private_key)
        except (ValueError, TypeError):
            raise ChainError("the private key is not a valid 32-byte hex key") from None
    return dev_accounts(args.dev_account + 1)[args.dev_account]


def _client(args: argparse.Namespace, signer: bool) -> LedgerClient:
    # Read the record first: a wrong path is reported before the slow imports.
    deployment = load_deployment(args.deployment)
    account = _account(args) if signer else None

    from prime_swarm.libs.chain.client import LedgerClient

    return LedgerClient.from_deployment(
        deployment, account, rpc_url=args.rpc_url, timeout=args.timeout
    )


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


# --- commands ---------------------------------------------------------------------------------


def cmd_address(args: argparse.Namespace) -> int:
    """A service key's address, for the pool owner to register: a validator's, a trainer's."""
    from prime_swarm.libs.chain.keyfile import load_or_create_key

    print(load_or_create_key(args.key_file).address)
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from prime_swarm.libs.chain.compile import stale_artifacts, write_artifacts

    if args.check:
        stale = stale_artifacts()
        if stale:
            print(
                f"stale artifacts: {', '.join(stale)}; run `prime-chain compile`", file=sys.stderr
            )
            return 1
        print("artifacts are up to date", file=sys.stderr)
        return 0
    for path in write_artifacts():
        print(path)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from prime_swarm.libs.chain.deploy import deploy_ledger
    from prime_swarm.libs.chain.deployment import write_deployment

    deployment = deploy_ledger(
        args.rpc_url,
        _account(args),
        slash_bps=args.slash_bps,
        unbonding_blocks=args.unbonding_blocks,
        challenge_blocks=args.challenge_blocks,
        timeout=args.timeout,
    )
    write_deployment(args.out, deployment)
    print(f"deployed {deployment.contract} at block {deployment.block}", file=sys.stderr)
    print(deployment.address)
    return 0


def cmd_create_pool(args: argparse.Namespace) -> int:
    new_id = _client(args, signer=True).create_pool(
        args.orchestrator_url,
        args.min_stake,
        args.reward_per_unit,
        args.trainer,
        activate=not args.pending,
    )
    state = "pending: set its slash policy, then `activate-pool`" if args.pending else "active"
    print(f"pool {new_id} created, {state}", file=sys.stderr)
    print(new_id)
    return 0


def cmd_activate_pool(args: argparse.Namespace) -> int:
    _client(args, signer=True).activate_pool(args.pool)
    return 0


def cmd_end_pool(args: argparse.Namespace) -> int:
    _client(args, signer=True).end_pool(args.pool)
    return 0


def cmd_set_slash_policy(args: argparse.Namespace) -> int:
    _client(args, signer=True).set_slash_policy(args.pool, args.reporter_bps, args.burn)
    return 0


# A change of state says what it did: silence after a transaction reads as "nothing happened".


def cmd_set_orchestrator_url(args: argparse.Namespace) -> int:
    _client(args, signer=True).set_orchestrator_url(args.pool, args.orchestrator_url)
    print(f"pool {args.pool}: orchestrator {args.orchestrator_url}")
    return 0


def cmd_set_trainer(args: argparse.Namespace) -> int:
    _client(args, signer=True).set_trainer(args.pool, args.trainer)
    print(f"pool {args.pool}: trainer {args.trainer}")
    return 0


def cmd_register_validator(args: argparse.Namespace) -> int:
    _client(args, signer=True).register_validator(args.pool, args.validator)
    print(f"pool {args.pool}: validator {args.validator} registered")
    return 0


def cmd_remove_validator(args: argparse.Namespace) -> int:
    _client(args, signer=True).remove_validator(args.pool, args.validator)
    print(f"pool {args.pool}: validator {args.validator} removed")
    return 0


def cmd_fund_pool(args: argparse.Namespace) -> int:
    client = _client(args, signer=True)
    client.fund_pool(args.pool, args.amount)
    print(client.pool_funds(args.pool))
    return 0


def _pool_data(client: LedgerClient, pool_id: int) -> dict[str, object]:
    pool = client.get_pool(pool_id)
    return {
        **asdict(pool),
        "status": pool.status.name.lower(),
        "batches": client.batch_count(pool_id),
        "burnt": client.burnt(pool_id),
        "challenge_blocks": client.challenge_blocks(),
        "unbonding_blocks": client.unbonding_blocks(),
    }


def _worker_data(client: LedgerClient, pool_id: int, worker: str) -> dict[str, object]:
    client.get_pool(pool_id)  # an unknown pool is an error, not a row of zeros
    rewards = client.rewards(pool_id, worker)
    return {
        "pool_id": pool_id,
        "worker": worker,
        "is_member": client.is_member(pool_id, worker),
        "is_validator": client.is_validator(pool_id, worker),
        "stake": client.stake_of(pool_id, worker),
        "unbonding_until": client.unbonding_until(pool_id, worker),
        "reward_balance": rewards.total,
        "rewards_claimable": rewards.claimable,
        "rewards_pending": rewards.pending,
        "work_units": client.work_units(pool_id, worker),
        "work_id_floor": client.work_id_floor(pool_id, worker),
        "native_balance": client.balance_of(worker),
    }


def cmd_pool_info(args: argparse.Namespace) -> int:
    _print_json(_pool_data(_client(args, signer=False), args.pool))
    return 0


def cmd_balances(args: argparse.Namespace) -> int:
    _print_json(_worker_data(_client(args, signer=False), args.pool, args.worker))
    return 0


def cmd_pool_status(args: argparse.Namespace) -> int:
    """The pool for a person: the same facts as `pool-info`, amounts in ETH."""
    client = _client(args, signer=False)
    p = client.get_pool(args.pool)
    slash_to = "burnt" if p.burn_slashed else "to the pool's funds"
    rows = [
        ("status", p.status.name.lower()),
        ("owner", p.owner),
        ("orchestrator", p.orchestrator_url),
        ("trainer", p.trainer),
        ("min stake", eth(p.min_stake)),
        ("reward per unit", eth(p.reward_per_unit)),
        ("funds", eth(p.funds)),
        ("attested", f"{p.total_attested_units} units in {client.batch_count(args.pool)} batches"),
        ("slashes", f"{p.reporter_bps / 100:g} % to the reporter, the rest {slash_to}"),
        ("burnt", eth(client.burnt(args.pool))),
        ("challenge window", f"{client.challenge_blocks()} blocks"),
        ("unbonding", f"{client.unbonding_blocks()} blocks"),
    ]
    _print_rows(f"pool {args.pool}", rows)
    return 0


def cmd_worker_status(args: argparse.Namespace) -> int:
    """A worker for a person: the same facts as `balances`, amounts in ETH."""
    client = _client(args, signer=False)
    pool_id, worker = args.pool, args.worker
    client.get_pool(pool_id)
    rewards = client.rewards(pool_id, worker)
    until = client.unbonding_until(pool_id, worker)
    if client.is_member(pool_id, worker):
        membership = "member"
    elif until:
        membership = f"left; stake withdrawable from block {until}"
    else:
        membership = "not a member"
    if client.is_validator(pool_id, worker):
        membership += " (and a validator)"
    rows = [
        ("membership", membership),
        ("stake", eth(client.stake_of(pool_id, worker))),
        ("work units", str(client.work_units(pool_id, worker))),
        ("rewards", f"{eth(rewards.claimable)} claimable, {eth(rewards.pending)} in the window"),
        ("next work id", str(client.work_id_floor(pool_id, worker))),
        ("wallet", eth(client.balance_of(worker))),
    ]
    _print_rows(f"worker {worker} in pool {pool_id}", rows)
    return 0


def _print_rows(title: str, rows: Sequence[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(title)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


# --- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Its commands take no settings class (every value is an argument), so only the shared
    # parser is used: `--version`, one-line usage errors.
    parser = new_parser("prime-chain", "Compile, deploy and administer the Prime Swarm ledger.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str,
        handler: Callable[[argparse.Namespace], int],
        help: str,
        aliases: Sequence[str] = (),
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, aliases=list(aliases))
        p.set_defaults(handler=handler)
        return p

    p = command("address", cmd_address, "print a key file's address, creating the key if missing")
    p.add_argument(
        "--key-file", required=True, help="JSON key file; created (mode 0600) if missing"
    )

    p = command("compile", cmd_compile, "compile protocol/contracts/*.vy into build/*.json")
    p.add_argument("--check", action="store_true", help="only check the artifacts are current")

    p = command("deploy", cmd_deploy, "deploy the ledger and write a deployment record")
    p.add_argument("--rpc-url", required=True)
    p.add_argument(
        "--out", default="deployment.json", help="deployment record path (default: %(default)s)"
    )
    p.add_argument(
        "--slash-bps",
        type=bps,
        default=DEFAULT_SLASH_BPS,
        help="share of a stake one slash takes, in basis points (default: %(default)s)",
    )
    p.add_argument(
        "--unbonding-blocks",
        type=blocks,
        default=DEFAULT_UNBONDING_BLOCKS,
        help="blocks a leaving worker's stake stays slashable before it can be withdrawn "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--challenge-blocks",
        type=blocks,
        default=None,
        help="blocks an attestation can be disputed for, after which its rewards can be claimed; "
        f"at most --unbonding-blocks (default: {DEFAULT_CHALLENGE_BLOCKS}, or the unbonding "
        "period if shorter)",
    )
    p.add_argument(
        "--timeout", type=float, default=120.0, help="receipt timeout, s (default: %(default)s)"
    )
    _add_key_options(p)

    p = command("create-pool", cmd_create_pool, "open a pool; prints its id")
    _add_deployment_options(p)
    p.add_argument(
        "--orchestrator-url", required=True, help="where workers find the pool's orchestrator"
    )
    p.add_argument(
        "--min-stake", type=amount, required=True, help=f"a worker's least stake; {AMOUNT_HELP}"
    )
    p.add_argument(
        "--reward-per-unit",
        type=amount,
        required=True,
        help=f"paid per attested unit (a completion token); {AMOUNT_HELP}",
    )
    p.add_argument(
        "--trainer", type=address, required=True, help="address that signs the policy manifests"
    )
    p.add_argument(
        "--pending",
        action="store_true",
        help="leave the pool pending (no joins) to set its slash policy first; then activate-pool",
    )
    _add_key_options(p)

    for name, handler, text in (
        ("activate-pool", cmd_activate_pool, "open a pending pool to workers"),
        ("end-pool", cmd_end_pool, "stop joins; leased work is still attested and paid"),
    ):
        p = command(name, handler, text)
        _add_deployment_options(p)
        p.add_argument("--pool", type=pool_id, required=True)
        _add_key_options(p)

    p = command(
        "set-slash-policy", cmd_set_slash_policy, "where slashed stake goes (pending pools only)"
    )
    _add_deployment_options(p)
    p.add_argument("--pool", type=pool_id, required=True)
    p.add_argument(
        "--reporter-bps", type=bps, required=True, help="share for the reporting validator"
    )
    p.add_argument("--burn", action="store_true", help="burn the rest instead of funding the pool")
    _add_key_options(p)

    p = command("set-orchestrator-url", cmd_set_orchestrator_url, "change a pool's URL")
    _add_deployment_options(p)
    p.add_argument("--pool", type=pool_id, required=True)
    p.add_argument(
        "--orchestrator-url", required=True, help="where workers find the pool's orchestrator"
    )
    _add_key_options(p)

    p = command("set-trainer", cmd_set_trainer, "change the address that signs a pool's policies")
    _add_deployment_options(p)
    p.add_argument("--pool", type=pool_id, required=True)
    p.add_argument("--trainer", type=address, required=True)
    _add_key_options(p)

    for name, handler, text, aliases in (
        (
            "register-validator",
            cmd_register_validator,
            "let an address attest and slash",
            ["add-validator"],
        ),
        ("remove-validator", cmd_remove_validator, "revoke a validator", []),
    ):
        p = command(name, handler, text, aliases)
        _add_deployment_options(p)
        p.add_argument("--pool", type=pool_id, required=True)
        p.add_argument("--validator", type=address, required=True)
        _add_key_options(p)

    p = command("fund-pool", cmd_fund_pool, "add reward funds; prints the pool's funds")
    _add_deployment_options(p)
    p.add_argument("--pool", type=pool_id, required=True)
    p.add_argument("--amount", type=amount, required=True, help=AMOUNT_HELP)
    _add_key_options(p)

    # Reads: the JSON forms for scripts, the status forms for people.
    for name, handler, text, per_worker in (
        ("pool-info", cmd_pool_info, "print a pool as JSON", False),
        ("balances", cmd_balances, "print a worker's stake and rewards as JSON", True),
        ("pool-status", cmd_pool_status, "show a pool: state, funds, work, rules", False),
        ("worker-status", cmd_worker_status, "show a worker: stake, work, rewards", True),
    ):
        p = command(name, handler, text)
        _add_deployment_options(p)
        p.add_argument("--pool", type=pool_id, required=True)
        if per_worker:
            p.add_argument("--worker", type=address, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with a usage line on bad arguments
    try:
        return args.handler(args)
    except (ChainError, KeyFileError, OSError) as exc:
        print(f"prime-chain {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
