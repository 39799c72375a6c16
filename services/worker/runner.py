"""A contributor's worker: stake, register, heartbeat, fetch policies, answer leases."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import httpx
from eth_account.signers.local import LocalAccount
from tqdm import tqdm

from prime_swarm.libs.environments import EnvLoadError, load_env
from prime_swarm.libs.environments.sandbox.interpreter import InterpreterError, require_tool_python
from prime_swarm.libs.model.backend import GenerationBackend
from prime_swarm.libs.model.causal_lm import PRECISIONS
from prime_swarm.libs.policy.store import LoadedPolicy, PolicyError, PolicyStore
from prime_swarm.libs.rollout.answer import PendingSubmission, ProofBuilder, start_leases
from prime_swarm.protocol.messages import (
    Heartbeat,
    LeaseRequest,
    PolicyInfo,
    PoolEnvironment,
    RegisterRequest,
    SubmissionBatch,
    SubmitBatchReply,
    WorkerStack,
    normal_address,
)

from . import metrics
from .client import OrchestratorClient, OrchestratorError
from .onboarding import JoinError
from .settings import WorkerSettings
from .status_line import Snapshot

log = logging.getLogger("worker")

# The orchestrator's refusals that mean "you are off the roster" (its ejector claimed this
# worker, or its Redis lost the roster) and "you are off the pool on chain" (ejected, left, or
# slashed below the minimum): both are mended by the worker itself, within REJOIN_BUDGET.
OFF_ROSTER = "not_registered"
OFF_POOL = ("not_a_member", "stake_below_minimum")
REJOIN_BUDGET = (5, 600.0)
"""At most this many re-registrations in this many seconds: more is a fault that waiting on
does not mend, and the worker stops with one line instead of spinning."""

SWITCH_WAIT_S = 0.25
"""How long a worker holding leases waits for an announced version's download before it
generates them with the version it holds."""


def require_environments(
    environments: Sequence[PoolEnvironment], tool_python: str | None = None
) -> None:
    """The pool's environments are packages this machine must have installed (and able to
    build with the pool's arguments), and the code they run needs the pool's pinned tool
    interpreter: a worker that lacks either says so when it joins, not at the first lease."""
    try:
        for pooled in environments:
            load_env(pooled.env, pooled.env_args)
        if tool_python is not None:
            require_tool_python(tool_python)
    except (EnvLoadError, InterpreterError) as exc:
        raise JoinError(f"cannot answer this pool's leases: {exc}") from None


class Worker:
    """Works for a pool it has already joined on chain (see `onboarding`): registers, then
    leases, generates, proves and submits until `stop` is set."""

    def __init__(
        self,
        settings: WorkerSettings,
        account: LocalAccount,
        backend: GenerationBackend,
        orchestrator_url: str,
        trusted_trainer: str,
        hardware: str = "",
        snapshot: Snapshot | None = None,
        rejoin: Callable[[], str] | None = None,
        stack: WorkerStack | None = None,
    ) -> None:
        """`rejoin`: stakes this key back into the pool on chain when it is no longer a member
        (ejected for a silence that was its own); returns a line saying what it did, raises
        `JoinError` saying what the contributor must do. None: the worker stops instead."""
        self.settings, self.account, self.backend = settings, account, backend
        self.orchestrator_url, self.trusted_trainer = orchestrator_url, trusted_trainer
        self.hardware = hardware
        self.snapshot = snapshot or Snapshot()
        self.stop = threading.Event()
        self.policy_info: PolicyInfo | None = None
        self.store: PolicyStore | None = None
        self.submitted = 0
        self.refused = 0
        self.rejoin, self.stack = rejoin, stack
        self._registrations: list[float] = []
        self.heartbeat_interval_s = 2.0

    # ------------------------------------------------------------------ loops
    def _heartbeat_loop(self, client: OrchestratorClient, interval: float) -> None:
        while not self.stop.wait(interval):
            try:
                self._refresh_policy_info(client)
            except Exception as exc:  # a missed heartbeat is not fatal; the next one retries
                log.warning("heartbeat failed: %s", exc)

    def _current_policy(self) -> LoadedPolicy | None:
        info = self.policy_info
        if info is None:
            return None
        if self.store is None:
            self.store = PolicyStore(
                self.settings.cache_dir / normal_address(self.account.address),
                self.trusted_trainer,
                keep=self.settings.keep_versions,
                keep_loaded=1,  # one model in memory: it generates with one version at a time
                timeout_s=self.settings.http_timeout_s * 4,
                dtype=PRECISIONS[self.settings.precision],
                device=self.settings.device,
            )
        held = self.store.latest_loaded()
        if held is not None and held.version >= info.version:
            return held
        if held is not None and held.version >= info.min_version:
            if not self.store.is_downloaded(info.version):
                # Still admitted: keep generating with it while the new version downloads.
                self.store.prefetch(info.version, info.relays)
                return held
        bar = tqdm(
            total=0,
            unit="B",
            unit_scale=True,
            desc=f"policy v{info.version}",
            disable=not self.settings.progress,
            leave=False,
        )

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            return self.store.get(info.version, info.relays, progress=progress)
        except PolicyError as exc:
            log.warning("%s; keeping the held version", exc)
            return held
        finally:
            bar.close()

    def _freshest(self, held: LoadedPolicy) -> LoadedPolicy:
        """The announced version if it arrives within SWITCH_WAIT_S, else `held`.

        A batch generated with a version the trainer has already replaced starts out one step
        stale, and policy lag is what ages work past the async bound; waiting a download's few
        tens of milliseconds for the new one is cheaper than a batch the trainer must drop.
        """
        info, store = self.policy_info, self.store
        if info is None or store is None or held.version >= info.version:
            return held
        if not store.is_downloaded(info.version):
            fetching = store.prefetch(info.version, info.relays)
            if fetching is not None:
                fetching.join(SWITCH_WAIT_S)
        if not store.is_downloaded(info.version) and held.version >= info.min_version:
            return held
        return self._current_policy() or held  # loads it, or waits for it if `held` is stale

    def run(self) -> None:
        client = OrchestratorClient(
            self.orchestrator_url,
            self.account,
            self.settings.http_timeout_s,
            self.settings.retry_budget,
            self.stop,
        )
        outage = Outage(self.settings.outage_budget_s, self.snapshot)
        if not self._register(client, outage):
            return
        hb = threading.Thread(
            target=self._heartbeat_loop, args=(client, self.heartbeat_interval_s), daemon=True
        )
        hb.start()
        try:
            self._work(client, outage)
        finally:
            self.stop.set()
            if self.store is not None:
                self.store.close()
            # A heartbeat in flight ends before its client closes.
            hb.join(self.settings.http_timeout_s)
            client.close()
            log.info(
                "worker stopped",
                extra={"fields": {"submitted": self.submitted, "refused": self.refused}},
            )

    def _register(self, client: OrchestratorClient, outage: Outage) -> bool:
        """Register (again), riding out an outage, and rejoin the pool on chain first if the
        orchestrator says this key is no longer a member. False if stopped meanwhile."""
        now = time.monotonic()
        count, window_s = REJOIN_BUDGET
        self._registrations = [t for t in self._registrations if now - t < window_s]
        if len(self._registrations) >= count:
            raise JoinError(
                f"registered {count} times in {window_s:.0f} s and lost it each time; "
                "ask the pool's operator (its status page names this worker's standing)"
            )
        self._registrations.append(now)
        request = RegisterRequest(
            worker=self.account.address,
            pool_id=self.settings.pool_id,
            backend=self.settings.backend,
            device=self.settings.device,
            hardware=self.hardware[:128],
            stack=self.stack,
        )
        rejoined = False
        while not self.stop.is_set():
            self.snapshot.activity = "registering"
            try:
                reply = client.register(request)
                break
            except OrchestratorError as exc:
                if exc.reason in OFF_POOL and not rejoined:
                    self._rejoin_pool(exc)
                    rejoined = True
                    continue
                if not exc.transient:
                    raise JoinError(f"registration refused: {exc}") from None
                outage.wait(self.stop, exc)
            except httpx.TransportError as exc:
                outage.wait(self.stop, exc)
        else:
            return False
        outage.over()
        self.policy_info, self.heartbeat_interval_s = reply.policy, reply.heartbeat_interval_s
        require_environments(reply.environments, reply.tool_python)
        log.info("registered", extra={"fields": {"orchestrator": self.orchestrator_url}})
        return True

    def _rejoin_pool(self, refusal: OrchestratorError) -> None:
        if self.rejoin is None:
            raise JoinError(f"no longer in the pool ({refusal.message}); run join again")
        log.warning("no longer in the pool, rejoining: %s", refusal.message)
        self.snapshot.activity = "rejoining the pool"
        log.warning("%s", self.rejoin())

    def _work(self, client: OrchestratorClient, outage: Outage) -> None:
        """Lease a batch, generate it in one go, hand it to the submitter and lease the next:
        proofs are built and the batch submitted on other threads while the next generates."""
        builder = ProofBuilder()
        submitter = Submitter(self, client)
        try:
            while not self.stop.is_set():
                owed = self.submitted + self.refused + submitter.queued
                if self.settings.max_rollouts and owed >= self.settings.max_rollouts:
                    return
                policy = self._current_policy()
                if policy is None:
                    self.snapshot.activity = "waiting for a policy"
                    self.stop.wait(0.5)
                    continue
                self.snapshot.version = policy.version
                count = self.settings.lease_batch
                if self.settings.max_rollouts:
                    count = min(count, self.settings.max_rollouts - owed)
                try:
                    reply = client.lease(
                        LeaseRequest(
                            worker=self.account.address,
                            pool_id=self.settings.pool_id,
                            policy_version=policy.version,
                            count=count,
                        )
                    )
                except OrchestratorError as exc:
                    if exc.transient:
                        outage.wait(self.stop, exc)
                    elif exc.reason == "stale_policy":
                        self._refresh_policy_info(client)
                    elif exc.reason == OFF_ROSTER or exc.reason in OFF_POOL:
                        log.warning("lease refused (%s): registering again", exc.reason)
                        if not self._register(client, outage):
                            return
                    else:
                        log.warning("lease refused: %s", exc)
                        self.stop.wait(1.0)
                    continue
                except httpx.TransportError as exc:
                    outage.wait(self.stop, exc)
                    continue
                outage.over()
                if reply.policy is not None:
                    self.policy_info = reply.policy
                if not reply.leases:
                    self.snapshot.activity = "waiting for work"
                    self.stop.wait(reply.retry_after_s or 0.5)
                    continue
                try:  # the pool's environment is a package this machine must have installed
                    for lease in reply.leases:
                        load_env(lease.env, lease.env_args)
                except EnvLoadError as exc:
                    log.error("cannot answer this pool's leases, leaving: %s", exc)
                    self.stop.set()
                    break
                policy = self._freshest(policy)
                self.snapshot.activity = "generating"
                self.snapshot.leases += len(reply.leases)
                started = time.monotonic()
                generating_since = time.time()
                pending = start_leases(policy, reply.leases, self.backend, builder)
                # When it generated, and with which version: a version switch's pause (the gap
                # between the last batch on k and the first on k+1) is read off these lines.
                log.info(
                    "generated",
                    extra={
                        "fields": {
                            "version": policy.version,
                            "leases": len(reply.leases),
                            "since": round(generating_since, 3),
                            "seconds": round(time.monotonic() - started, 3),
                        }
                    },
                )
                submitter.put(pending, started)
        finally:
            submitter.close()
            builder.close()

    def record(
        self, jobs: list[PendingSubmission], reply: SubmitBatchReply, started: float
    ) -> None:
        for result in reply.results:
            if result.status == 200:
                self.submitted += 1
                self.snapshot.submitted += 1
                metrics.SUBMITTED.inc()
            else:
                self.refused += 1
                metrics.REFUSED.labels(result.reason or "error").inc()
                log.warning(
                    "submission refused: %s %s: %s", result.status, result.reason, result.message
                )
        log.info(
            "submitted",
            extra={
                "fields": {
                    "leases": len(jobs),
                    "version": jobs[0].policy_version,
                    "seconds": round(time.monotonic() - started, 3),
                }
            },
        )

    def _refresh_policy_info(self, client: OrchestratorClient) -> None:
        """Heartbeat, and adopt the policy the orchestrator announces."""
        reply = client.heartbeat(
            Heartbeat(worker=self.account.address, pool_id=self.settings.pool_id)
        )
        if reply.policy is not None:
            self.policy_info = reply.policy


class Outage:
    """Rides out an unreachable or overloaded orchestrator: waits with exponential backoff
    (capped at a minute), shows it on the status line, and gives up only after `budget_s`
    without one good answer."""

    def __init__(self, budget_s: float, snapshot: Snapshot) -> None:
        self.budget_s, self.snapshot = budget_s, snapshot
        self.since: float | None = None
        self.attempt = 0

    def wait(self, stop: threading.Event, err: Exception) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("orchestrator unavailable, riding it out: %s", err)
        if now - self.since > self.budget_s:
            raise JoinError(
                f"the orchestrator has not answered for {now - self.since:.0f} s ({err}); "
                "giving up (raise --outage-budget-s to wait longer)"
            )
        delay = min(60.0, 2.0**self.attempt)
        self.attempt += 1
        self.snapshot.activity = f"orchestrator unavailable, retrying in {delay:.0f} s"
        stop.wait(delay)

    def over(self) -> None:
        if self.since is not None:
            log.info(
                "orchestrator back",
                extra={"fields": {"down_s": round(time.monotonic() - self.since, 1)}},
            )
        self.since, self.attempt = None, 0


class Submitter:
    """One thread that waits for a batch's proofs and submits the batch in one request, so the
    worker's next generation never waits on proofs or on the orchestrator's round trip."""

    def __init__(self, worker: Worker, client: OrchestratorClient, depth: int = 2) -> None:
        self.worker, self.client = worker, client
        self._q: queue.Queue[tuple[list[PendingSubmission], float] | None] = queue.Queue(depth)
        self._queued = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="submitter", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        with self._lock:
            return self._queued

    def put(self, jobs: list[PendingSubmission], started: float) -> None:
        with self._lock:
            self._queued += len(jobs)
        self._q.put((jobs, started))  # blocks when submitting lags: back-pressure on leasing

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            jobs, started = item
            try:
                batch = SubmissionBatch(
                    worker=self.worker.account.address,
                    pool_id=self.worker.settings.pool_id,
                    submissions=[job.result() for job in jobs],
                )
                self.worker.record(jobs, self.client.submit_batch(batch), started)
            except OrchestratorError as exc:
                self.worker.refused += len(jobs)
                metrics.REFUSED.labels(exc.reason).inc(len(jobs))
                log.warning("batch submission refused: %s", exc)
            except Exception:  # never let one batch kill the thread and wedge the worker
                log.exception("batch submission failed")
                self.worker.refused += len(jobs)
            finally:
                with self._lock:
                    self._queued -= len(jobs)
