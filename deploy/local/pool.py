"""A pool on the chain and the orchestrator in front of it: the one bring-up of both.

`start_pool` deploys the ledger, creates the pool, registers its validators, stakes its first
members and starts the orchestrator where the placement puts it. The local network (network.py:
`make up`, chaos, the end-to-end tests, the trainer, hostile and wide-area benches) starts its
pool with it, and so do the integration tests and the benches that need an orchestrator without
a training network (fuzz, orchestrator bench): one order of deployment, one set of orchestrator
variables, one readiness check, on loopback or on a testbed host.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anvil import set_balance
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.localnet.balancer import Balancer
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.streams.connection import connect
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import PolicyAnnouncement

from .placement import OnThisMachine, Placement, url

# Where an orchestrator with no relays behind it points workers: nothing listens there.
NO_RELAYS = '["http://127.0.0.1:1"]'


def script(name: str) -> str:
    """The console script next to this interpreter (the venv's), so PATH does not matter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def create_pool(
    rpc_url: str,
    owner: LocalAccount,
    orchestrator_url: str,
    trainer: str,
    *,
    min_stake_wei: int = 10**18,
    reward_per_unit_wei: int = 1,
    unbonding_blocks: int | None = None,
    validators: Sequence[str] = (),
    fund_wei: int = 0,
) -> tuple[str, int]:
    """Deploy a ledger, create a pool on it, register `validators`, fund its rewards.
    Returns (ledger address, pool id)."""
    deploy_kw = {} if unbonding_blocks is None else {"unbonding_blocks": unbonding_blocks}
    ledger = deploy_ledger(rpc_url, owner, **deploy_kw).address
    client = LedgerClient(rpc_url, ledger, account=owner, timeout=30)
    pool_id = client.create_pool(orchestrator_url, min_stake_wei, reward_per_unit_wei, trainer)
    for v in validators:
        client.register_validator(pool_id, v)
    if fund_wei:
        client.fund_pool(pool_id, fund_wei)
    return ledger, pool_id


def stake_member(rpc_url: str, ledger: str, pool_id: int, account: LocalAccount, wei: int) -> None:
    """Fund `account` and stake `wei` in the pool: a worker that joined."""
    set_balance(rpc_url, account.address, 5 * wei)
    LedgerClient(rpc_url, ledger, account=account, timeout=30).join(pool_id, wei)


def announce_placeholder_policy(redis_url: str, version: int) -> None:
    """A fresh stream state with policy `version` announced, for an orchestrator that has no
    trainer behind it (its leases name that version; nothing serves it)."""
    r = connect(redis_url, socket_timeout=10)
    try:
        r.flushdb()
        ann = PolicyAnnouncement(
            version=version,
            step=version,
            model_hash="ab" * 32,
            manifest_path=f"/v1/versions/{version}/manifest",
        )
        r.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(ann))
    finally:
        r.close()


def orchestrator_env(
    port: int, redis_url: str, rpc_url: str, ledger: str, pool_id: int, relays: str = NO_RELAYS
) -> dict[str, str]:
    """The variables every orchestrator of a pool needs; callers add their own."""
    return {
        "PRIME_ORCH_PORT": str(port),
        "PRIME_ORCH_REDIS_URL": redis_url,
        "PRIME_ORCH_RPC_URL": rpc_url,
        "PRIME_ORCH_LEDGER_ADDRESS": ledger,
        "PRIME_ORCH_POOL_ID": str(pool_id),
        "PRIME_ORCH_RELAYS": relays,
    }


def start_orchestrator(
    logs: Path,
    env: dict[str, str],
    timeout_s: float = 30.0,
    name: str = "orchestrator",
    *,
    argv_prefix: Sequence[str] = (),
    url: str | None = None,
) -> ManagedProcess:
    """The `prime-orchestrator` process with `env`, once it answers /healthz (stopped if not).
    `argv_prefix` and `url`: started on another host (a testbed's), reached at `url`."""
    argv = [*argv_prefix, script("prime-orchestrator")]
    proc = ManagedProcess(name, argv, logs, env=env, cwd=Path.cwd())
    url = url or f"http://127.0.0.1:{env['PRIME_ORCH_PORT']}"
    try:
        proc.wait_http(f"{url}/healthz", timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc


@dataclass
class Pool:
    """A pool on the chain and its running orchestrators (`start_pool`): one, or `replicas`
    behind an HAProxy balancer whose address is the pool's. A context manager: they stop on
    exit (the chain and Redis belong to whoever started them)."""

    url: str
    rpc_url: str
    redis_url: str
    ledger: str
    pool_id: int
    logs: Path
    env: dict[str, str]
    argv_prefix: list[str] = field(default_factory=list)
    replicas: int = 1
    processes: list[ManagedProcess] = field(default_factory=list)
    balancer: Balancer | None = None

    @property
    def process(self) -> ManagedProcess | None:
        """The orchestrator (the first replica)."""
        return self.processes[0] if self.processes else None

    def _replica_env(self, i: int, ports: list[int]) -> dict[str, str]:
        if self.replicas == 1:
            return {}
        return {"PRIME_ORCH_PORT": str(ports[i]), "PRIME_ORCH_HOST": "127.0.0.1"}

    def start(self, timeout_s: float = 30.0, **overrides: str) -> ManagedProcess:
        """(Re)start the orchestrators with `overrides` added to their variables: the same
        ports and Redis, so the pool's state carries over."""
        self.stop()
        ports = [free_port() for _ in range(self.replicas)] if self.replicas > 1 else []
        for i in range(self.replicas):
            env = {**self.env, **overrides, **self._replica_env(i, ports)}
            name = "orchestrator" if self.replicas == 1 else f"orchestrator-{i}"
            where = self.url if self.replicas == 1 else f"http://127.0.0.1:{ports[i]}"
            self.processes.append(
                start_orchestrator(
                    self.logs, env, timeout_s, name, argv_prefix=self.argv_prefix, url=where
                )
            )
        if self.replicas > 1:
            port = int(self.url.rsplit(":", 1)[1])
            backends = [("127.0.0.1", p) for p in ports]
            self.balancer = Balancer(backends, self.logs.parent / "haproxy", self.logs, port)
        return self.processes[0]

    def restart(self, timeout_s: float = 30.0, replica: int = 0) -> None:
        """kill -9 an orchestrator and start it again as it was, as a supervisor would."""
        proc = self.processes[replica]
        proc.kill()
        proc.stop()
        self.processes[replica] = proc.respawn()
        port = self.processes[replica].env["PRIME_ORCH_PORT"]  # type: ignore[index]
        host = self.url if self.replicas == 1 else f"http://127.0.0.1:{port}"
        self.processes[replica].wait_http(f"{host}/healthz", timeout_s)

    def stop(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
            self.balancer = None
        for proc in self.processes:
            proc.stop()
        self.processes = []

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_pool(
    logs: Path,
    rpc_url: str,
    redis_url: str,
    owner: LocalAccount,
    trainer: str,
    *,
    placement: Placement | None = None,
    min_stake_wei: int = 10**18,
    reward_per_unit_wei: int = 1,
    unbonding_blocks: int | None = None,
    validators: Sequence[str] = (),
    fund_wei: int = 0,
    members: Sequence[LocalAccount] = (),
    placeholder_version: int | None = None,
    relays: str = NO_RELAYS,
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    replicas: int = 1,
) -> Pool:
    """The pool on the chain (`create_pool`), `members` staked at the minimum, and its
    orchestrator started where `placement` puts it (default: this machine's loopback), with
    `env` added to the variables every orchestrator needs. `placeholder_version`: a fresh Redis
    with that policy announced, for an orchestrator with no trainer behind it."""
    place = placement or OnThisMachine()
    orchestrator_url = url(place, "orchestrator")
    ledger, pool_id = create_pool(
        rpc_url, owner, orchestrator_url, trainer,
        min_stake_wei=min_stake_wei, reward_per_unit_wei=reward_per_unit_wei,
        unbonding_blocks=unbonding_blocks, validators=validators, fund_wei=fund_wei,
    )  # fmt: skip
    for member in members:
        stake_member(rpc_url, ledger, pool_id, member, min_stake_wei)
    if placeholder_version is not None:
        announce_placeholder_policy(redis_url, placeholder_version)
    variables = {
        **orchestrator_env(place.port("orchestrator"), redis_url, rpc_url, ledger, pool_id, relays),
        "PRIME_ORCH_HOST": place.bind("orchestrator"),
        **(env or {}),
    }
    pool = Pool(
        orchestrator_url, rpc_url, redis_url, ledger, pool_id, logs, variables,
        place.argv("orchestrator", []), replicas,
    )  # fmt: skip
    pool.start(timeout_s)
    return pool
