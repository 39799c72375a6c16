"""Before a contributor's first wei moves: the chain, the pool, the key's funds, the hardware and
the orchestrator are checked, and every failure is one line naming the flag to change.

Staking is the only step that costs money and the only one that cannot be undone at once (the
stake unbonds), so it comes last, after everything that could make it pointless has answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anchor import trusted_trainer
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError, ChainRevert
from prime_swarm.libs.chain.models import Pool
from prime_swarm.libs.chain.units import eth
from prime_swarm.libs.environments.registry import EnvLoadError
from prime_swarm.libs.environments.sandbox.interpreter import InterpreterError, require_tool_python
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.rollout.stacks import local_stack, stack_refusal
from prime_swarm.protocol.messages import WorkerStack

from .client import OrchestratorClient, OrchestratorError
from .settings import WorkerChainSettings, WorkerSettings

log = logging.getLogger("worker")
GAS_HEADROOM_WEI = 10**16  # enough for join + leave on any dev chain


class JoinError(RuntimeError):
    """A problem the contributor must fix, said in one line that names the flag to change."""


@dataclass(frozen=True)
class Standing:
    """This key in this pool, as the chain sees it."""

    pool: Pool
    address: str
    balance: int
    member: bool
    stake: int
    unbonding_until: int
    units: int
    rewards: int


def read_standing(ledger: LedgerClient, settings: WorkerChainSettings, address: str) -> Standing:
    """The pool and this key's place in it; chain failures become `JoinError`s naming a flag."""
    try:
        ledger.check()
    except ChainError as exc:
        if "no contract" in str(exc):
            raise JoinError(
                f"no ledger at {settings.ledger_address} on {settings.rpc_url}; "
                "check --ledger (PRIME_WORKER_LEDGER_ADDRESS)"
            ) from None
        raise JoinError(
            f"cannot reach the chain at {settings.rpc_url}; check --rpc-url "
            f"(PRIME_WORKER_RPC_URL) ({exc})"
        ) from None
    pool_id = settings.pool_id
    try:
        pool = ledger.get_pool(pool_id)
        return Standing(
            pool=pool,
            address=address,
            balance=ledger.balance_of(address),
            member=ledger.is_member(pool_id, address),
            stake=ledger.stake_of(pool_id, address),
            unbonding_until=ledger.unbonding_until(pool_id, address),
            units=ledger.work_units(pool_id, address),
            rewards=ledger.reward_balance(pool_id, address),
        )
    except ChainRevert as exc:
        if exc.reason == "unknown pool":
            raise JoinError(
                f"pool {pool_id} does not exist on ledger {settings.ledger_address}; "
                "check --pool (PRIME_WORKER_POOL_ID)"
            ) from None
        raise JoinError(f"the ledger refused to describe pool {pool_id}: {exc.reason}") from None
    except ChainError as exc:
        raise JoinError(f"{exc}; check --rpc-url (PRIME_WORKER_RPC_URL)") from None


def check_trainer(pool: Pool, settings: WorkerSettings) -> str:
    try:
        return trusted_trainer(pool, settings.trainer)
    except ChainError as exc:
        raise JoinError(f"--trainer (PRIME_WORKER_TRAINER): {exc}") from None


def check_orchestrator(pool: Pool, timeout_s: float) -> None:
    """The orchestrator the pool names on chain answers; otherwise nothing is staked."""
    url = pool.orchestrator_url.rstrip("/")
    try:
        # Only the status matters: the body of a URL read from chain is never read.
        with httpx.stream("GET", f"{url}/healthz", timeout=timeout_s) as resp:
            status = resp.status_code
    except httpx.HTTPError as exc:
        raise JoinError(
            f"pool {pool.pool_id}'s orchestrator at {url} does not answer ({type(exc).__name__}); "
            "nothing was staked: try again later, or ask the pool's operator"
        ) from None
    if status != 200:
        raise JoinError(
            f"pool {pool.pool_id}'s orchestrator at {url} answers {status}; "
            "nothing was staked: try again later, or ask the pool's operator"
        )


def check_stack(
    pool: Pool, settings: WorkerSettings, device: str, account: LocalAccount
) -> WorkerStack | None:
    """This machine's stack against what the pool verifies, before anything is staked: one
    line naming what to install when the pool could not verify its work. None from an
    orchestrator that publishes no requirements (older than them): registration decides."""
    client = OrchestratorClient(pool.orchestrator_url, account, settings.http_timeout_s, 1)
    try:
        needs = client.requirements()
    except OrchestratorError as exc:
        if exc.status == 404:
            return None
        raise JoinError(
            f"pool {pool.pool_id}'s orchestrator answers requirements this worker cannot read "
            f"({exc}); nothing was staked: update prime-swarm or ask the pool's operator"
        ) from None
    except httpx.HTTPError as exc:
        raise JoinError(
            f"pool {pool.pool_id}'s orchestrator does not say what it requires "
            f"({type(exc).__name__}); nothing was staked: try again later"
        ) from None
    finally:
        client.close()
    envs = [e.env for e in needs.environments]
    assert settings.precision != "auto", "resolved before the stack is read"
    try:
        stack = local_stack(settings.backend, settings.precision, device_class(device), envs)
        if needs.tool_python is not None:
            require_tool_python(needs.tool_python)
    except (EnvLoadError, InterpreterError) as exc:
        raise JoinError(f"cannot answer pool {pool.pool_id}'s leases: {exc}") from None
    why = stack_refusal(stack, needs)
    if why is not None:
        raise JoinError(f"pool {pool.pool_id} cannot verify this machine's work: {why}")
    return stack


def stake_if_needed(
    ledger: LedgerClient,
    standing: Standing,
    confirm: Callable[[str], bool],
) -> bool:
    """Stake the pool's minimum unless already a member; True if a stake was sent.

    `confirm` is asked before anything is spent (a prompt, or `--yes`)."""
    if standing.member:
        return False
    pool = standing.pool
    # What is left from an earlier stake still unbonding counts towards the minimum.
    due = max(0, pool.min_stake - standing.stake)
    if standing.balance < due + GAS_HEADROOM_WEI:
        raise JoinError(
            f"{standing.address} holds {eth(standing.balance)}; staking into pool "
            f"{pool.pool_id} needs {eth(due)} plus gas (about {eth(GAS_HEADROOM_WEI)}): "
            "fund this address, then run join again"
        )
    question = (
        f"Stake {eth(due)} into pool {pool.pool_id}? It stays locked while you work and "
        f"unbonds after `prime-worker leave`."
    )
    if not confirm(question):
        raise JoinError("nothing staked: not confirmed (pass --yes to skip the question)")
    try:
        ledger.join(pool.pool_id, due)  # 0 rejoins on what is still unbonding
    except ChainError as exc:
        raise JoinError(f"staking failed: {exc}") from None
    log.info("staked", extra={"fields": {"pool": pool.pool_id, "eth": eth(due)}})
    return True


def rejoin(ledger: LedgerClient, settings: WorkerSettings, address: str) -> str:
    """Back into the pool on chain after losing membership mid-run (ejected for silence):
    free when what is still unbonding covers the minimum (gas only), otherwise only with
    `--yes`, which already agreed to stake the minimum. Returns what it did, in one line."""
    standing = read_standing(ledger, settings, address)
    pool = standing.pool
    if standing.member:
        if standing.stake >= pool.min_stake:
            return f"still a member of pool {pool.pool_id} on chain"
        raise JoinError(
            f"{eth(standing.stake)} staked in pool {pool.pool_id}, below its minimum "
            f"{eth(pool.min_stake)} (slashed: `prime-worker status` shows the verdicts)"
        )
    due = max(0, pool.min_stake - standing.stake)
    if due and not settings.yes:
        raise JoinError(
            f"no longer a member of pool {pool.pool_id}, and rejoining needs {eth(due)} more "
            "stake: run `prime-worker join` again (or pass --yes to restake by itself)"
        )
    stake_if_needed(ledger, standing, confirm=lambda _q: True)
    return f"rejoined pool {pool.pool_id} on chain ({eth(due)} staked anew)"
