"""A contributor's worker: stake, register, heartbeat, fetch policies, answer leases."""

from __future__ import annotations

import logging
import queue
import threading
import time

from eth_account.signers.local import LocalAccount
from tqdm import tqdm

from prime_swarm.libs.chain.anchor import trusted_trainer
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.errors import ChainError
from prime_swarm.libs.model.backend import GenerationBackend
from prime_swarm.libs.model.causal_lm import PRECISIONS
from prime_swarm.libs.policy.store import LoadedPolicy, PolicyError, PolicyStore
from prime_swarm.libs.rollout.answer import PendingSubmission, ProofBuilder, start_leases
from prime_swarm.protocol.messages import (
    Heartbeat,
    LeaseRequest,
    PolicyInfo,
    RegisterRequest,
    SubmissionBatch,
    SubmitBatchReply,
)

from . import metrics
from .client import OrchestratorClient, OrchestratorError
from .settings import WorkerSettings

log = logging.getLogger("worker")
GAS_HEADROOM_WEI = 10**16  # enough for join + leave on any dev chain


class JoinError(RuntimeError):
    """A problem the contributor must fix (funding, pool id); printed without a traceback."""


class Worker:
    def __init__(
        self, settings: WorkerSettings, account: LocalAccount, backend: GenerationBackend
    ) -> None:
        self.s, self.account, self.backend = settings, account, backend
        self.ledger = LedgerClient(
            settings.rpc_url,
            settings.ledger_address,
            account=account,
            timeout=settings.chain_timeout_s,
        )
        self.stop = threading.Event()
        self.policy_info: PolicyInfo | None = None
        self.trusted_trainer = ""  # set by join_pool from the chain (or the pinned flag)
        self.store: PolicyStore | None = None
        self._fetching: threading.Thread | None = None
        self.submitted = 0
        self.refused = 0

    # ------------------------------------------------------------------ joining
    def join_pool(self) -> str:
        """Stake into the pool if needed; return the orchestrator URL named on chain."""
        try:
            pool = self.ledger.get_pool(self.s.pool_id)
        except Exception as exc:
            raise JoinError(f"pool {self.s.pool_id} not found on chain: {exc}") from exc
        try:
            self.trusted_trainer = trusted_trainer(pool, self.s.trainer)
        except ChainError as exc:
            raise JoinError(f"--trainer: {exc}") from None
        if not self.ledger.is_member(self.s.pool_id, self.account.address):
            balance = self.ledger.balance_of(self.account.address)
            need = pool.min_stake + GAS_HEADROOM_WEI
            if balance < need:
                raise JoinError(
                    f"{self.account.address} holds {balance} wei; staking into pool "
                    f"{self.s.pool_id} needs {pool.min_stake} wei plus gas. Fund it and retry."
                )
            self.ledger.join(self.s.pool_id, pool.min_stake)
            log.info("staked", extra={"fields": {"pool": self.s.pool_id, "wei": pool.min_stake}})
        return pool.orchestrator_url

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
                self.s.cache_dir / self.account.address.lower(),
                self.trusted_trainer,
                keep=self.s.keep_versions,
                timeout_s=self.s.http_timeout_s * 4,
                dtype=PRECISIONS[self.s.precision],
                device=self.s.device,
            )
        held = self.store.latest_loaded()
        if held is not None and held.version >= info.version:
            return held
        if held is not None and held.version >= info.min_version:
            if not self.store.is_downloaded(info.version):
                # Still admitted: keep generating with it while the new version downloads.
                self._prefetch(info)
                return held
        if self._fetching is not None:
            self._fetching.join()  # never two downloads into one version's directory
        bar = tqdm(
            total=0,
            unit="B",
            unit_scale=True,
            desc=f"policy v{info.version}",
            disable=not self.s.progress,
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

    def _prefetch(self, info: PolicyInfo) -> None:
        if self._fetching is not None and self._fetching.is_alive():
            return
        store = self.store
        assert store is not None

        def fetch() -> None:
            try:
                store.download(info.version, info.relays)  # loading stays on the main thread
            except PolicyError as exc:
                log.warning("%s; keeping the held version", exc)

        self._fetching = threading.Thread(target=fetch, name="policy-prefetch", daemon=True)
        self._fetching.start()

    def run(self) -> None:
        orchestrator_url = self.join_pool()
        client = OrchestratorClient(
            orchestrator_url, self.account, self.s.http_timeout_s, self.s.retry_budget
        )
        try:
            reply = client.register(
                RegisterRequest(
                    worker=self.account.address,
                    pool_id=self.s.pool_id,
                    backend=self.s.backend,
                )
            )
        except OrchestratorError as exc:
            raise JoinError(f"registration refused: {exc}") from exc
        self.policy_info = reply.policy
        log.info("registered", extra={"fields": {"orchestrator": orchestrator_url}})
        hb = threading.Thread(
            target=self._heartbeat_loop, args=(client, reply.heartbeat_interval_s), daemon=True
        )
        hb.start()
        try:
            self._work(client)
        finally:
            self.stop.set()
            client.close()
            if self.s.unstake_on_exit:
                left = self.ledger.leave(self.s.pool_id)
                log.info(
                    "left the pool; run `prime-worker withdraw` once the stake has unbonded",
                    extra={"fields": {"wei": left.stake, "unbonding_until": left.unbonding_until}},
                )
            log.info(
                "worker stopped",
                extra={"fields": {"submitted": self.submitted, "refused": self.refused}},
            )

    def _work(self, client: OrchestratorClient) -> None:
        """Lease a batch, generate it in one go, hand it to the submitter and lease the next:
        proofs are built and the batch submitted on other threads while the next generates."""
        builder = ProofBuilder()
        submitter = Submitter(self, client)
        try:
            while not self.stop.is_set():
                owed = self.submitted + self.refused + submitter.queued
                if self.s.max_rollouts and owed >= self.s.max_rollouts:
                    return
                policy = self._current_policy()
                if policy is None:
                    self.stop.wait(0.5)
                    continue
                count = self.s.lease_batch
                if self.s.max_rollouts:
                    count = min(count, self.s.max_rollouts - owed)
                try:
                    reply = client.lease(
                        LeaseRequest(
                            worker=self.account.address,
                            pool_id=self.s.pool_id,
                            policy_version=policy.version,
                            count=count,
                        )
                    )
                except OrchestratorError as exc:
                    if exc.reason == "stale_policy":
                        self._refresh_policy_info(client)
                    else:
                        log.warning("lease refused: %s", exc)
                        self.stop.wait(1.0)
                    continue
                if reply.policy is not None:
                    self.policy_info = reply.policy
                if not reply.leases:
                    self.stop.wait(reply.retry_after_s or 0.5)
                    continue
                started = time.monotonic()
                submitter.put(start_leases(policy, reply.leases, self.backend, builder), started)
        finally:
            submitter.close()
            builder.close()

    def record(
        self, jobs: list[PendingSubmission], reply: SubmitBatchReply, started: float
    ) -> None:
        for result in reply.results:
            if result.status == 200:
                self.submitted += 1
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
        held = self.store.latest_loaded() if self.store else None
        reply = client.heartbeat(
            Heartbeat(
                worker=self.account.address,
                pool_id=self.s.pool_id,
                policy_version=held.version if held else None,
            )
        )
        if reply.policy is not None:
            self.policy_info = reply.policy


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
                    pool_id=self.worker.s.pool_id,
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
