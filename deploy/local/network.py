"""The whole network as local processes: redis, anvil, relays, orchestrator, validator, trainer,
workers. Each service is its own OS process started through its console script, exactly as in a
deployment; this module only wires addresses and keys together and watches progress."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.libs.chain.anvil import Anvil, set_balance
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.keyfile import write_key
from prime_swarm.libs.chain.models import Work
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess, ProcessFailed
from prime_swarm.libs.localnet.redis_ha import RedisHA
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.protocol import selection_records
from prime_swarm.protocol.messages import StepProgress
from prime_swarm.services.trainer import progress

from . import books
from .placement import OnThisMachine, Placement, url
from .pool import Pool, script, start_pool
from .settings import LocalNetworkSettings

RESTARTS_PER_PROCESS = 5
"""How often the launcher restarts one process that died before it calls the run failed: a
deployment's supervisor (systemd's Restart=on-failure, Kubernetes) restarts a replica that died
while its peers serve; a process that keeps dying is a fault restarts do not mend."""

OnRestart = Callable[[str, "int | None", int], None]
"""Told of each restart: the process's name, its exit code, and how many times it restarted."""


@dataclass
class Topology:
    redis_url: str = ""
    rpc_url: str = ""
    ledger: str = ""
    pool_id: int = 0
    origin_url: str = ""
    relay_urls: list[str] = field(default_factory=list)
    orchestrator_url: str = ""
    trainer_address: str = ""
    validators: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)


class LocalNetwork:
    def __init__(
        self,
        settings: LocalNetworkSettings,
        init_model_dir: Path,
        run_dir: Path,
        placement: Placement | None = None,
    ):
        """`placement`: where each process runs (default: all on this machine's loopback)."""
        self.settings, self.init_model_dir, self.run_dir = settings, init_model_dir, run_dir
        self.placement: Placement = placement or OnThisMachine()
        self.logs = run_dir / "logs"
        self.keys = run_dir / "keys"
        self.procs: dict[str, ManagedProcess] = {}
        self.redis: RedisServer | RedisHA | None = None
        # Read as the run goes: the streams are trimmed behind their consumers.
        self.books = books.Books()
        self._books_read_at = 0.0
        self.anvil: Anvil | None = None
        self.topo = Topology()
        self.pool: Pool | None = None
        self._cpu: dict[str, float] = {}
        self.retired: dict[str, ManagedProcess] = {}
        self.restarts: dict[str, int] = {}
        # One torch thread per process: the workers, a validator and a trainer share 2 cores.
        self.env = {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            # The recipe is set once, here, for every service.
            **settings.recipe.env_vars(),
        }

    # ------------------------------------------------------------------ start
    def start(self) -> Topology:
        t, place = self.topo, self.placement
        on_this_machine = isinstance(place, OnThisMachine)
        if (self.settings.redis_ha or self.settings.orchestrators > 1) and not on_this_machine:
            raise ValueError("--redis-ha and --orchestrators run on this machine only")
        if self.settings.redis_ha:
            self.redis = RedisHA(self.run_dir / "redis", self.logs)
        else:
            self.redis = RedisServer(
                self.run_dir / "redis",
                self.logs,
                port=place.port("redis"),
                bind=place.bind("redis"),
                argv_prefix=place.argv("redis", []),
                address=place.address("redis"),
            )
        t.redis_url = self.redis.url
        self.anvil = Anvil(
            accounts=4,
            port=place.port("anvil"),
            host=place.bind("anvil"),
            argv_prefix=place.argv("anvil", []),
            address=place.address("anvil"),
        ).start()
        t.rpc_url = self.anvil.rpc_url
        # Fresh keys for every role: anvil's dev keys are public, so a validator or pool owner
        # holding one could be impersonated by any process on the machine.
        owner, trainer = Account.create(), Account.create()
        validators = [Account.create() for _ in range(self.settings.validators)]
        for role, account in (("owner", owner), ("trainer", trainer)):
            write_key(self.keys / f"{role}.json", account)
        for i, v in enumerate(validators):
            write_key(self.keys / f"validator-{i}.json", v)
            self._fund(v, 10 * 10**18)  # pays for attestations and slashes
        self._fund(owner, 100 * 10**18)  # deploys, funds the pool's rewards
        t.trainer_address = trainer.address
        t.validators = [v.address for v in validators]

        # The orchestrator's variables name the relays by address: they need not be up yet.
        t.origin_url = url(place, "origin")
        t.relay_urls = [url(place, name) for name in place.relays()]
        self.pool = start_pool(
            self.logs,
            t.rpc_url,
            t.redis_url,
            owner,
            trainer.address,
            placement=place,
            min_stake_wei=self.settings.min_stake_wei,
            reward_per_unit_wei=self.settings.reward_per_unit_wei,
            unbonding_blocks=self.settings.unbonding_blocks,
            validators=t.validators,
            fund_wei=10 * 10**18,
            relays=self.sources,
            replicas=self.settings.orchestrators,
            env={
                **self.env,
                # The local pool ejects workers that vanish (killed, crashed).
                "PRIME_ORCH_OWNER_KEY_FILE": str(self.keys / "owner.json"),
                "PRIME_ORCH_EJECT_AFTER_S": str(self.settings.eject_after_s),
                "PRIME_ORCH_LEASE_TTL_S": str(self.settings.lease_ttl_s),
                "PRIME_ORCH_TASK_SEED": str(self.settings.task_seed),
                **(
                    {"PRIME_ORCH_TRAIN_TASKS": str(self.settings.train_tasks)}
                    if self.settings.train_tasks is not None
                    else {}
                ),
                # Groups in flight, not counting the batch the trainer has taken: one step's
                # worth. Measured (bench/trainer): 1.25-1.5 steps dropped 3-4x the
                # groups as stale for no more trained completions per second.
                "PRIME_ORCH_MAX_IN_FLIGHT_GROUPS": str(self.settings.groups_per_step),
            },
        )
        for i, proc in enumerate(self.pool.processes):
            self.procs[self.orchestrator_name(i)] = proc
        if self.pool.balancer is not None:
            self.procs["haproxy"] = self.pool.balancer.process
        t.orchestrator_url, t.ledger, t.pool_id = self.pool.url, self.pool.ledger, self.pool.pool_id

        # Relays keep every version whose rollouts can still be admitted, plus the one in flight.
        keep = self.settings.recipe.async_level + 2
        for name, mode in [("origin", ["origin"])] + [
            (r, ["relay", "--parent", t.origin_url]) for r in place.relays()
        ]:
            self._spawn(
                name,
                [
                    script("prime-relay"),
                    *mode,
                    "--host",
                    place.bind(name),
                    "--port",
                    str(place.port(name)),
                    "--data-dir",
                    str(self.run_dir / name),
                    "--trainer",
                    trainer.address,
                    "--keep-versions",
                    str(keep),
                ],
            ).wait_http(f"{url(place, name)}/healthz")

        self._spawn(
            "trainer",
            [script("prime-trainer")],
            env={
                "PRIME_TRAINER_REDIS_URL": t.redis_url,
                "PRIME_TRAINER_ORIGIN_URL": t.origin_url,
                "PRIME_TRAINER_KEY_FILE": str(self.keys / "trainer.json"),
                "PRIME_TRAINER_INIT_MODEL_DIR": str(self.init_model_dir),
                "PRIME_TRAINER_CHECKPOINT_DIR": str(self.run_dir / "checkpoints"),
                "PRIME_TRAINER_PROGRESS_FILE": str(self.progress_file),
                "PRIME_TRAINER_MAX_STEPS": str(self.settings.steps),
                "PRIME_TRAINER_GROUPS_PER_STEP": str(self.settings.groups_per_step),
                "PRIME_TRAINER_LR": str(self.settings.lr),
                "PRIME_TRAINER_PUBLISH_PRECISION": self.settings.publish_precision,
                "PRIME_TRAINER_THREADS": str(self.settings.trainer_threads),
                "PRIME_TRAINER_SHARD_SIZE": str(self.settings.shard_size),
                "PRIME_TRAINER_SEED": str(self.settings.task_seed),
                "PRIME_TRAINER_FILTER_ZERO_VARIANCE": str(
                    self.settings.filter_zero_variance
                ).lower(),
                "PRIME_TRAINER_METRICS_PORT": str(free_port()),
            },
        )
        for i in range(self.settings.validators):
            self._spawn_validator(i)
        for _ in range(self.settings.workers):
            self.add_worker()
        return t

    def _spawn_validator(self, i: int) -> None:
        t = self.topo
        self._spawn(
            f"validator-{i}",
            [script("prime-validator")],
            env={
                "PRIME_VALIDATOR_REDIS_URL": t.redis_url,
                "PRIME_VALIDATOR_RPC_URL": t.rpc_url,
                "PRIME_VALIDATOR_LEDGER_ADDRESS": t.ledger,
                "PRIME_VALIDATOR_POOL_ID": str(t.pool_id),
                "PRIME_VALIDATOR_KEY_FILE": str(self.keys / f"validator-{i}.json"),
                "PRIME_VALIDATOR_RELAYS": self.sources,
                # Each its own cache; its consumer name derives from its own address.
                "PRIME_VALIDATOR_CACHE_DIR": str(self.run_dir / f"validator-{i}-cache"),
                "PRIME_VALIDATOR_METRICS_PORT": str(free_port()),
                # A transaction per 64 attestations, not 32: each waits for its receipt on
                # the validator's loop (the ledger's batch-64 gas is the target of its bench).
                "PRIME_VALIDATOR_ATTEST_BATCH_SIZE": "64",
            },
        )

    def add_worker(
        self, command: list[str] | None = None, env: dict[str, str] | None = None
    ) -> str:
        """Create, fund and start one more worker (`worker-N`), as a contributor joining the
        running pool would: it stakes, registers and generates. Returns its address.

        `command` replaces the `prime-worker` program (bench/hostile runs cheating workers
        that way, with the same flags); `env` adds to its environment."""
        t, i = self.topo, len(self.topo.workers)
        account = Account.create()
        key = self.keys / f"worker-{i}.json"
        write_key(key, account)
        self._fund(account, 5 * 10**18)
        t.workers.append(account.address)
        self._spawn(
            f"worker-{i}",
            [
                *(command or [script("prime-worker")]),
                "join",
                "--pool",
                str(t.pool_id),
                "--rpc-url",
                t.rpc_url,
                "--ledger",
                t.ledger,
                "--key-file",
                str(key),
                "--cache-dir",
                str(self.run_dir / "worker-cache"),
                "--no-progress",
                "--yes",  # the operator's own workers stake without asking
                "--backend",
                self.worker_backend(i),
            ],
            env={"PRIME_WORKER_LEASE_BATCH": str(self.settings.lease_batch), **(env or {})},
        )
        return account.address

    def retire(self, name: str, *, kill: bool = False) -> int | None:
        """Take `name` out of the watched processes and stop it: SIGTERM (a worker finishes
        the batch in hand) or, with `kill`, SIGKILL as a crash would. The run goes on without
        it; `follow` no longer counts its exit as a failure."""
        proc = self.procs.pop(name)
        self.retired[name] = proc
        if kill:
            proc.kill()
        return proc.stop()

    def crash_and_restart(self, name: str) -> None:
        """SIGKILL `name` (a service process, or "redis") and start it again as it was: the
        same command, port, key and data directory, as a supervisor would."""
        if name == "redis":
            assert self.redis is not None
            self.redis.crash_and_restart()
            return
        self.procs[name].kill()
        self.respawn(name)

    def respawn(self, name: str) -> None:
        """Start `name` again (it has exited) with the same command, as a supervisor would."""
        proc = self.procs[name]
        self.procs[name] = proc.respawn()
        if self.pool is not None and proc in self.pool.processes:
            self.pool.processes[self.pool.processes.index(proc)] = self.procs[name]

    def orchestrator_name(self, i: int) -> str:
        return "orchestrator" if self.settings.orchestrators == 1 else f"orchestrator-{i}"

    @property
    def orchestrators(self) -> list[str]:
        """The orchestrator processes' names, and the balancer's in front of replicas."""
        return [n for n in self.procs if n.startswith("orchestrator") or n == "haproxy"]

    @property
    def sources(self) -> str:
        """Where workers and the validator fetch policies: the relay first, and the origin
        too, so a version is fetched the moment it is published rather than after the relay's
        next poll (policy lag ages work past the async bound). Integrity does not depend on
        which one serves: every shard is checked against the trainer's signed manifest."""
        return json.dumps([*self.topo.relay_urls, self.topo.origin_url])

    def worker_backend(self, i: int) -> str:
        return self.settings.worker_backends[i % len(self.settings.worker_backends)]

    @property
    def progress_file(self) -> Path:
        return self.run_dir / "progress.jsonl"

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(
            name,
            self.placement.argv(name, argv),
            self.logs,
            env={**self.env, **(env or {})},
            cwd=Path.cwd(),
        )
        self.procs[name] = proc
        return proc

    def _fund(self, account: LocalAccount, wei: int) -> None:
        set_balance(self.topo.rpc_url, account.address, wei)

    # ------------------------------------------------------------------ watch
    def follow(
        self,
        on_step: Callable[[StepProgress], None],
        timeout_s: float,
        until: Callable[[list[StepProgress]], bool] | None = None,
        on_restart: OnRestart | None = None,
    ) -> list[StepProgress]:
        """Report each new trainer step until the trainer exits, or until `until(rows so far)`
        holds (a budget the caller keeps); a service that dies is restarted (`supervise`)."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        trainer = self.procs["trainer"]
        while True:
            rows = progress.read(self.progress_file)
            for i in range(seen, len(rows)):
                on_step(rows[i])
                if until is not None and until(rows[: i + 1]):
                    return rows[: i + 1]
            seen = len(rows)
            self.cpu_seconds()
            self.read_books(every_s=30.0)
            if not trainer.alive():
                if trainer.proc.returncode != 0:
                    raise ProcessFailed(
                        f"trainer exited with {trainer.proc.returncode}:\n{trainer.tail()}"
                    )
                return progress.read(self.progress_file)
            self.supervise(spare=("trainer",), on_restart=on_restart)
            if time.monotonic() > deadline:
                raise TimeoutError(f"run did not finish within {timeout_s:.0f}s")
            time.sleep(0.5)

    def supervise(
        self,
        spare: tuple[str, ...] = (),
        on_restart: OnRestart | None = None,
        budget: int | None = RESTARTS_PER_PROCESS,
    ) -> list[str]:
        """Restart, as a deployment's supervisor would, every process (but `spare`) that has
        exited: the run goes on while its peers serve. Past `budget` restarts of one process
        (None: no limit) the run fails with its last lines. Returns the names restarted."""
        restarted = []
        for name, p in list(self.procs.items()):
            if name in spare or p.alive():
                continue
            code = p.proc.returncode
            if budget is not None and self.restarts.get(name, 0) >= budget:
                raise ProcessFailed(
                    f"{name} exited with {code} after {budget} restarts:\n{p.tail()}"
                )
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self.respawn(name)
            restarted.append(name)
            if on_restart is not None:
                on_restart(name, code, self.restarts[name])
        return restarted

    def read_books(self, every_s: float = 0.0) -> None:
        """Catch the books up with the streams (at most once every `every_s`)."""
        if time.monotonic() - self._books_read_at < every_s:
            return
        assert self.redis is not None
        r = self.redis.client()
        try:
            self.books.read(r)
        finally:
            r.close()
        self._books_read_at = time.monotonic()

    def stream_counts(self) -> dict[str, object]:
        """Rollouts submitted, verified and rejected (with the reasons) over the whole run."""
        self.read_books()
        return self.books.counts()

    def selection_counts(self) -> dict[str, dict[str, int]]:
        """What live prompt selection did, by environment: tasks drawn, skipped (a lease, a
        group's generations and a validation saved each), explored and forced."""
        assert self.redis is not None
        r = self.redis.client()
        try:
            raw = r.hgetall(selection_records.COUNTS)
        finally:
            r.close()
        counts: dict[str, dict[str, int]] = {}
        for key, n in raw.items():
            env, what = key.decode().rsplit(":", 1)
            counts.setdefault(env, {})[what] = int(n)
        return counts

    def _ledger(self) -> LedgerClient:
        """The pool's ledger, read only."""
        return LedgerClient(self.topo.rpc_url, self.topo.ledger, account=None, timeout=30)

    def attested_units(self) -> int:
        return self._ledger().attested_units(self.topo.pool_id)

    def attested_items(self) -> list[Work]:
        """Every item the pool's batches credited, rebuilt from the chain (slow: a few RPCs a
        batch; for diagnosing books that do not balance)."""
        ledger, pool = self._ledger(), self.topo.pool_id
        batches = range(1, ledger.batch_count(pool) + 1)
        return [w for b in batches for w in ledger.batch_items(pool, b)]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each service process (trainer, validator, workers...);
        a process that has exited keeps its last reading (`follow` takes one every poll)."""
        for name, p in self.procs.items():
            used = p.cpu_seconds()
            if used is not None:
                self._cpu[name] = round(used, 2)
        return dict(self._cpu)

    def close_books(self) -> dict[str, object]:
        """Stop the workers, orchestrators and validators (each validator flushes its queued
        attestations), then account for every submitted rollout (books.Books)."""
        self.stop_workers()
        self.stop_validators()
        assert self.redis is not None
        r = self.redis.client()
        try:
            closed = self.books.account(r, self.attested_units())
        finally:
            r.close()
        if closed["onchain_units"] != closed["validator_units"]:
            closed["chain_vs_validators"] = self.books.chain_difference(self.attested_items())
        return closed

    def stop_validators(self) -> None:
        """SIGTERM every validator and wait for each to flush its queued attestations."""
        for name in [n for n in self.procs if n.startswith("validator-")]:
            self.procs[name].stop(timeout_s=60)

    def stop_workers(self) -> None:
        for name in [n for n in self.procs if n.startswith("worker-")] + self.orchestrators:
            if name in self.procs:
                self.procs[name].stop()

    def stop(self) -> None:
        # Validators last among services: on SIGTERM each flushes its queued attestations.
        order = [n for n in self.procs if n.startswith("worker-")] + self.orchestrators
        order += ["trainer"]
        order += [n for n in self.procs if n.startswith("validator-")]
        order += [*self.placement.relays(), "origin"]
        for name in order:
            if name in self.procs:
                self.procs[name].stop(timeout_s=30 if name.startswith("validator-") else 10)
        for proc in self.retired.values():
            proc.stop()  # already stopped: closes what is left
        if self.redis:
            self.redis.stop()
        if self.anvil:
            self.anvil.stop()


def new_run_dir(runs_dir: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = runs_dir / stamp
    n = 1
    while run_dir.exists():
        run_dir = runs_dir / f"{stamp}-{n}"
        n += 1
    run_dir.mkdir(parents=True)
    return run_dir


def point_latest(runs_dir: Path, run_dir: Path) -> None:
    link = runs_dir / "latest"
    tmp = runs_dir / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    tmp.replace(link)
