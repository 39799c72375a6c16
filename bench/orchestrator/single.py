"""`make bench-orchestrator`, part one: 100 simulated workers sending signed requests to one
orchestrator.

The orchestrator runs as its own uvicorn process (`prime-orchestrator`, one process as deployed)
on 127.0.0.1, in front of a real redis-server and a real anvil chain with the ledger deployed, a
pool created and every simulated worker staked, so each lease and submission passes the same
stake check (cached `standing_cache_s`, re-read on chain after that) as in production. A policy
is announced on the trainer's stream, and the validator's consumer group exists, so leases are
issued and submissions are admitted to `rollouts:submitted`; no validator runs.

The workers live in `--clients` separate processes (asyncio, one keep-alive connection per
worker). Every worker request is EIP-191 signed with `protocol/signing.sign_request`, the
worker's own signing code, with a fresh timestamp and nonce; the server verifies it, burns the
nonce in Redis and counts it against the worker's rate limit. The limits are raised far above
the load (`ORCHESTRATOR_ENV`) so the bench measures throughput, not the limiter; the limiter's
Redis script still runs on every request.

Phases, one after another on the same server (the first `warmup_s` of each are not counted):

- baseline_healthz: unsigned GET /healthz, every worker back to back: the server's empty-request
  rate, the baseline the other rates are reported against;
- heartbeat: signed /v1/heartbeat, every worker back to back;
- submit: each worker leases `--lease-count` groups (/v1/lease), answers each with a signed
  /v1/submit (a group of `group_size` fake but well-formed completions: token ids within
  max_new_tokens, one logprob per token, a proof of TOPLOC's size), and heartbeats every
  `heartbeat_interval_s`, back to back: the saturated rate and its latencies;
- submit_batch: the same through /v1/submit/batch, `--batch` submissions per signed request;
- open_loop_target: submissions arriving at `--target-rate` a second in all (Poisson per worker),
  heartbeats every 2 s, latency counted from each submission's scheduled time (so a server that
  falls behind shows it: no coordinated omission);
- open_loop_<N>pct: the same at N % of the rate `submit` reached (`--below-capacity`, when that
  is under the target): the latency the server gives below its saturation point;
- profile: `submit` again with py-spy sampling the orchestrator (not counted in the figures);
- submit_standing_polled: `submit` again after restarting the orchestrator with each worker's
  stake re-read on chain every 5 s (the default before ledger events dropped changed standings):
  what polling the chain per worker costs.

    python -m bench.orchestrator [--workers 100] [--clients 4] [--duration 10]

Writes bench/results/orchestrator.json: `workers`, `submissions_per_s` and `p50_ms`/`p99_ms`
(the `submit` phase: the saturated /v1/submit rate and its latencies), `heartbeats_per_s`, the
per-phase details (per-route latencies, statuses, CPU seconds of orchestrator, redis, anvil,
clients and other processes, the orchestrator's event-loop thread against its other threads,
Redis commands per request), the baseline, ratios against it, and `where_time_goes` (process
CPU split and the py-spy profile of the orchestrator by library and function).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import multiprocessing as mp
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis
from eth_account import Account
from eth_account.signers.local import LocalAccount

from prime_swarm.deploy.local.pool import (
    Pool,
    start_pool,
)
from prime_swarm.libs.chain.anvil import Anvil, set_balance
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.streams.consumer import ensure_group
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    PROTOCOL_VERSION,
    Heartbeat,
    LeaseRequest,
    RegisterRequest,
    RolloutSubmission,
    SubmissionBatch,
)
from prime_swarm.protocol.signing import sign_request

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "orchestrator.json"

POLICY_VERSION = 5
MIN_STAKE = 10**18
TRAINER = "0x" + "11" * 20
HEARTBEAT_INTERVAL_S = 2.0  # the orchestrator's default `heartbeat_interval_s`
POLLED_STANDING_S = 5.0  # re-reading each stake this often is what events replaced
PROOF_BYTES_PER_TOKEN = 48  # TOPLOC's proof size (bench/results/toploc.json `bytes_per_token`)
PROMPT_TOKENS = 32
REQUEST_TIMEOUT_S = 30.0

# Orchestrator settings of the run (PRIME_ORCH_*). The per-worker limits and the pool-wide chain
# lookup budget are raised so that the limiter is not what is measured (it still runs: one Redis
# script per request); the in-flight budget so that leases are never withheld.
_UNLIMITED = {"per_second": 1_000_000.0, "burst": 1_000_000}
ORCHESTRATOR_ENV: dict[str, str] = {
    "PRIME_ORCH_RATE_LIMITS": json.dumps(
        {
            route: _UNLIMITED
            for route in ("registration", "heartbeat", "lease", "submit", "submit_batch")
        }
    ),
    "PRIME_ORCH_CHAIN_LOOKUP_RATE": json.dumps({"per_second": 10_000.0, "burst": 10_000}),
    "PRIME_ORCH_MAX_IN_FLIGHT_GROUPS": str(10**9),
    "PRIME_ORCH_MAX_OPEN_LEASES_PER_WORKER": "64",
    "PRIME_ORCH_LOG_LEVEL": "WARNING",
}


# ---------------------------------------------------------------- a lean HTTP/1.1 client


class HttpConn:
    """One keep-alive HTTP/1.1 connection. A minimal client on purpose: the load generator shares
    the machine's cores with the server, and every microsecond it spends is one the server lacks.
    uvicorn answers with Content-Length, which is all this reads."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        if self.reader is not None and self.reader.at_eof():
            self.close()  # the server closed it while idle (uvicorn's keep-alive timeout)
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines += ["content-type: application/json", f"content-length: {len(body)}"]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            status = int(status_line.split(" ", 2)[1])
            length, close = 0, False
            for line in header_lines:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
                elif name == "transfer-encoding":
                    raise ConnectionError(f"unexpected transfer-encoding {value.strip()}")
            data = await self.reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


# ---------------------------------------------------------------- one simulated worker


@dataclass
class Recorder:
    """Requests completed inside [t_from, t_to] (monotonic): latencies and statuses by route."""

    t_from: float
    t_to: float
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    extra: Counter = field(default_factory=Counter)

    def counts(self, t_done: float) -> bool:
        return self.t_from <= t_done <= self.t_to

    def add(self, route: str, status: int, t_start: float, t_done: float) -> None:
        if self.counts(t_done):
            self.statuses[route][status] += 1
            self.latencies[route].append((t_done - t_start) * 1000.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "latencies": dict(self.latencies),
            "statuses": {r: dict(c) for r, c in self.statuses.items()},
            "extra": dict(self.extra),
        }


@dataclass(frozen=True)
class WorkerConfig:
    host: str
    port: int
    pool_id: int
    policy_version: int
    group_size: int
    tokens: int
    lease_count: int
    batch: int


def completions_json(group_size: int, tokens: int, seed: int) -> str:
    """A group of fake but well-formed completions, as JSON (the same for all of a worker's
    submissions; each submission answers a different lease, so no two are duplicates)."""
    rng = random.Random(seed)
    group = []
    for _ in range(group_size):
        group.append(
            {
                "token_ids": [rng.randrange(1, 32_000) for _ in range(tokens)],
                "finish_reason": "length",
                "proof": base64.b64encode(rng.randbytes(PROOF_BYTES_PER_TOKEN * tokens)).decode(),
                "logprobs": [round(-rng.random() * 5, 4) for _ in range(tokens)],
            }
        )
    return json.dumps(group, separators=(",", ":"))


class SimWorker:
    def __init__(self, key: str, cfg: WorkerConfig, seed: int) -> None:
        self.account: LocalAccount = Account.from_key(key)
        self.address = self.account.address
        self.cfg = cfg
        self.http = HttpConn(cfg.host, cfg.port)
        self.stock: deque[tuple[str, str]] = deque()  # (lease_id, task_id) leased, not answered
        self.rng = random.Random(seed)
        self.completions = completions_json(cfg.group_size, cfg.tokens, seed)
        self.prompt = json.dumps(list(range(1, PROMPT_TOKENS + 1)))
        self.heartbeat_body = Heartbeat(worker=self.address, pool_id=cfg.pool_id).model_dump_json()
        self.next_heartbeat = 0.0

    # -- bodies

    def submission_json(self, lease_id: str, task_id: str) -> str:
        # Built as text, so the client spends no pydantic time per request; the main process
        # parses one with `RolloutSubmission` (unknown fields refused) before the run.
        return (
            f'{{"protocol_version":{PROTOCOL_VERSION},"lease_id":"{lease_id}","worker":"{self.address}",'
            f'"pool_id":{self.cfg.pool_id},"task_id":{json.dumps(task_id)},'
            f'"policy_version":{self.cfg.policy_version},"backend":"hf","precision":"bf16",'
            f'"prompt_token_ids":{self.prompt},"completions":{self.completions}}}'
        )

    def lease_body(self, count: int) -> bytes:
        return (
            LeaseRequest(
                worker=self.address,
                pool_id=self.cfg.pool_id,
                policy_version=self.cfg.policy_version,
                count=count,
            )
            .model_dump_json()
            .encode()
        )

    # -- requests

    async def post(self, rec: Recorder, route: str, path: str, body: bytes) -> tuple[int, bytes]:
        headers = sign_request(self.account, "POST", path, "", body)
        t0 = time.monotonic()
        try:
            status, data = await asyncio.wait_for(
                self.http.request("POST", path, body, headers), REQUEST_TIMEOUT_S
            )
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            status, data = 0, b""  # 0: no HTTP answer (reset, timeout, garbled)
            self.http.close()
        rec.add(route, status, t0, time.monotonic())
        return status, data

    async def register(self, rec: Recorder) -> int:
        body = RegisterRequest(worker=self.address, pool_id=self.cfg.pool_id).model_dump_json()
        status, _ = await self.post(rec, "register", "/v1/register", body.encode())
        return status

    async def healthz(self, rec: Recorder) -> None:
        t0 = time.monotonic()
        try:
            status, _ = await self.http.request("GET", "/healthz", None, {})
        except (OSError, asyncio.IncompleteReadError, ValueError):
            status = 0
        rec.add("healthz", status, t0, time.monotonic())

    async def heartbeat(self, rec: Recorder) -> None:
        self.next_heartbeat = time.monotonic() + HEARTBEAT_INTERVAL_S
        await self.post(rec, "heartbeat", "/v1/heartbeat", self.heartbeat_body.encode())

    async def lease(self, rec: Recorder, count: int) -> None:
        status, data = await self.post(rec, "lease", "/v1/lease", self.lease_body(count))
        if status != 200:
            await asyncio.sleep(0.1)
            return
        reply = json.loads(data)
        for lease in reply["leases"]:
            self.stock.append((lease["lease_id"], lease["task_id"]))
        if not reply["leases"]:
            rec.extra["empty_lease_replies"] += 1
            await asyncio.sleep(float(reply.get("retry_after_s") or 0.1))

    async def submit_one(self, rec: Recorder, scheduled: float | None = None) -> None:
        lease_id, task_id = self.stock.popleft()
        body = self.submission_json(lease_id, task_id).encode()
        status, _ = await self.post(rec, "submit", "/v1/submit", body)
        if scheduled is not None:
            rec.add("submit_from_schedule", status, scheduled, time.monotonic())

    async def submit_batch(self, rec: Recorder, n: int) -> None:
        subs = [self.submission_json(*self.stock.popleft()) for _ in range(n)]
        body = (
            f'{{"protocol_version":{PROTOCOL_VERSION},"worker":"{self.address}","pool_id":{self.cfg.pool_id},'
            f'"submissions":[{",".join(subs)}]}}'
        ).encode()
        status, data = await self.post(rec, "submit_batch", "/v1/submit/batch", body)
        if status == 200 and rec.counts(time.monotonic()):
            results = Counter(r["status"] for r in json.loads(data)["results"])
            rec.extra["batched_submissions_admitted"] += results.pop(200, 0)
            for code, n_refused in results.items():
                rec.extra[f"batched_submissions_refused_{code}"] += n_refused

    # -- phases

    async def drive(self, mode: str, start: float, end: float, rec: Recorder, rate: float) -> None:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        if mode == "healthz":
            while time.monotonic() < end:
                await self.healthz(rec)
        elif mode == "heartbeat":
            while time.monotonic() < end:
                await self.heartbeat(rec)
        elif mode == "submit":
            self.next_heartbeat = start + self.rng.random() * HEARTBEAT_INTERVAL_S
            while time.monotonic() < end:
                if not self.stock:
                    await self.lease(rec, self.cfg.lease_count)
                    continue
                await self.submit_one(rec)
                if time.monotonic() >= self.next_heartbeat:
                    await self.heartbeat(rec)
        elif mode == "submit_batch":
            while time.monotonic() < end:
                if len(self.stock) < self.cfg.batch:
                    await self.lease(rec, min(64, self.cfg.batch - len(self.stock)))
                    continue
                await self.submit_batch(rec, self.cfg.batch)
        elif mode == "open_loop":
            await self.open_loop(start, end, rec, rate)
        else:
            raise ValueError(mode)

    async def open_loop(self, start: float, end: float, rec: Recorder, rate: float) -> None:
        """Submissions at Poisson arrival times of `rate` a second; sequential on the worker's
        one connection, so a late one goes at once and its latency counts from its schedule."""
        self.next_heartbeat = start + self.rng.random() * HEARTBEAT_INTERVAL_S
        due = start + self.rng.expovariate(rate)
        while due < end:
            # Idle time before the next arrival: keep leases in stock, heartbeat when due.
            if len(self.stock) <= self.cfg.lease_count // 2:
                await self.lease(rec, self.cfg.lease_count)
                continue
            if time.monotonic() >= self.next_heartbeat and time.monotonic() < due:
                await self.heartbeat(rec)
                continue
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not self.stock:
                continue
            await self.submit_one(rec, scheduled=due)
            due += self.rng.expovariate(rate)


# ---------------------------------------------------------------- a client process


def sign_rate(account: LocalAccount, body: bytes, seconds: float = 1.0) -> float:
    """Signatures a second this process makes alone: the client's own cost per request."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sign_request(account, "POST", "/v1/submit", "", body)
        n += 1
    return n / (time.perf_counter() - t0)


def client_main(index: int, keys: list[str], cfg: WorkerConfig, conn: Connection) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_client(index, keys, cfg, conn))
    except Exception as exc:  # tell the main process instead of leaving it waiting
        conn.send(("error", f"client {index}: {type(exc).__name__}: {exc}"))
        raise


async def _client(index: int, keys: list[str], cfg: WorkerConfig, conn: Connection) -> None:
    workers = [SimWorker(k, cfg, seed=1000 * index + i) for i, k in enumerate(keys)]
    rec = Recorder(0.0, math.inf)
    statuses = await asyncio.gather(*(w.register(rec) for w in workers))
    bad = [s for s in statuses if s != 200]
    if bad:
        raise RuntimeError(f"registration answered {Counter(bad)}")
    sample = workers[0].submission_json("0" * 24, "reverse:train:0").encode()
    conn.send(("ready", {"sign_per_s": sign_rate(workers[0].account, sample)}))
    loop = asyncio.get_running_loop()
    while True:
        msg = await loop.run_in_executor(None, conn.recv)
        if msg[0] == "stop":
            break
        phase = msg[1]
        start, end = phase["start"], phase["end"]
        rec = Recorder(start + phase["warmup_s"], end)
        cpu0 = time.process_time()
        rate = phase.get("rate_per_worker") or 0.0
        await asyncio.gather(*(w.drive(phase["mode"], start, end, rec, rate) for w in workers))
        result = rec.as_dict()
        result["client_cpu_s"] = time.process_time() - cpu0
        result["leases_left"] = sum(len(w.stock) for w in workers)
        conn.send(("result", result))
    for w in workers:
        w.http.close()


# ---------------------------------------------------------------- the stack


def proc_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None if gone."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> tuple[float, float, dict[str, int]]:
    """(main thread, other threads) CPU seconds of a process, and each thread's context
    switches. The other threads' share is the process's total less the main thread's, so
    threads that ended meanwhile still count."""
    tick = os.sysconf("SC_CLK_TCK")
    total = proc_cpu_seconds(pid)
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0, {}
    main = (int(stat[11]) + int(stat[12])) / tick
    switches: dict[str, int] = {}
    for tid in tids:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # a thread that just ended
        switches[tid] = sum(
            int(line.split(":", 1)[1]) for line in status.splitlines() if "ctxt_switches:" in line
        )
    return main, max(0.0, (total or 0.0) - main), switches


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine, all cores (/proc/stat: all but idle and iowait)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def micro_baselines(redis_url: str, account: LocalAccount, body: bytes) -> dict[str, float]:
    """Two costs every signed request pays, measured alone in this process: one redis-py
    asyncio round trip (sequential SETs on the bench's redis-server, under uvloop as the
    orchestrator runs) and one signature recovery as `verify_request` does it."""
    import uvloop
    from eth_account.messages import encode_defunct
    from redis.asyncio import Redis

    from prime_swarm.protocol.signing import (
        HEADER_NONCE,
        HEADER_SIGNATURE,
        HEADER_TIMESTAMP,
        canonical_request,
    )

    async def round_trips(n: int = 3000) -> tuple[float, float]:
        r = Redis.from_url(redis_url)
        await r.set("bench:micro", b"1", ex=60)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await r.set("bench:micro", b"1", ex=60)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        await r.aclose()
        return wall / n, cpu / n

    rt_wall, rt_cpu = uvloop.run(round_trips())
    headers = sign_request(account, "POST", "/v1/submit", "", body)
    text = canonical_request(
        "POST", "/v1/submit", "", body, headers[HEADER_TIMESTAMP], headers[HEADER_NONCE]
    )
    n, t0 = 1000, time.process_time()
    for _ in range(n):
        Account.recover_message(encode_defunct(text=text), signature=headers[HEADER_SIGNATURE])
    recover = (time.process_time() - t0) / n
    return {
        "redis_round_trip_us_wall": round(1e6 * rt_wall, 1),
        "redis_round_trip_us_client_cpu": round(1e6 * rt_cpu, 1),
        "signature_recovery_us_cpu": round(1e6 * recover, 1),
    }


def stake_workers(rpc_url: str, ledger: str, pool_id: int, n: int) -> list:
    """`n` fresh keys, funded and staked at the pool's minimum (a few threads: anvil mines each
    transaction as it comes)."""
    accounts = [Account.create() for _ in range(n)]
    for a in accounts:
        set_balance(rpc_url, a.address, 5 * MIN_STAKE)

    def join(a: LocalAccount) -> None:
        LedgerClient(rpc_url, ledger, account=a, timeout=60).join(pool_id, MIN_STAKE)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(join, accounts))
    return accounts


@dataclass
class Stack:
    pool: Pool
    redis: RedisServer
    anvil_pid: int | None
    accounts: list
    recipe: Recipe

    @property
    def url(self) -> str:
        return self.pool.url

    @property
    def port(self) -> int:
        return int(self.pool.env["PRIME_ORCH_PORT"])

    @property
    def pool_id(self) -> int:
        return self.pool.pool_id

    @property
    def orchestrator(self) -> ManagedProcess:
        assert self.pool.process is not None
        return self.pool.process

    def start_orchestrator(self, **overrides: str) -> ManagedProcess:
        """(Re)start the orchestrator on the same port; pool state stays in Redis."""
        return self.pool.start(60, **overrides)


def start_stack(stack: ExitStack, work: Path, workers: int, tokens: int | None) -> Stack:
    node = stack.enter_context(Anvil(accounts=2))
    server = RedisServer(work / "redis", work / "logs")
    stack.callback(server.stop)
    env = dict(ORCHESTRATOR_ENV)
    if tokens is not None:
        env["PRIME_RECIPE_MAX_NEW_TOKENS"] = str(tokens)
    pool = stack.enter_context(
        start_pool(
            work / "logs", node.rpc_url, server.url, node.dev_accounts(1)[0], TRAINER,
            min_stake_wei=MIN_STAKE, placeholder_version=POLICY_VERSION, env=env, timeout_s=60,
        )
    )  # fmt: skip
    accounts = stake_workers(node.rpc_url, pool.ledger, pool.pool_id, workers)
    r = server.client()
    # The consumer groups a deployment has, so the in-flight count reads them as it would there.
    ensure_group(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
    ensure_group(r, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP)
    r.close()
    recipe = Recipe(**({"max_new_tokens": tokens} if tokens is not None else {}))
    anvil_pid = getattr(getattr(node, "_proc", None), "pid", None)
    return Stack(pool, server, anvil_pid, accounts, recipe)


def check_wire_format(worker_cfg: WorkerConfig, key: str) -> None:
    """The hand-built JSON is what the protocol's models parse and would themselves produce."""
    w = SimWorker(key, worker_cfg, seed=0)
    # extra="forbid": a stray or misspelled field would fail here, not at the server.
    sub = RolloutSubmission.model_validate_json(w.submission_json("ab" * 12, "reverse:train:7"))
    assert all(len(c.token_ids) <= worker_cfg.tokens for c in sub.completions)
    SubmissionBatch(worker=w.address, pool_id=worker_cfg.pool_id, submissions=[sub])


# ---------------------------------------------------------------- phases


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))
    return round(sorted_values[k], 3)


def latency_summary(values: list[float]) -> dict[str, Any]:
    s = sorted(values)
    return {
        "n": len(s),
        "p50_ms": percentile(s, 50),
        "p90_ms": percentile(s, 90),
        "p99_ms": percentile(s, 99),
        "max_ms": round(s[-1], 3) if s else None,
        "mean_ms": round(sum(s) / len(s), 3) if s else None,
    }


class Runner:
    def __init__(self, st: Stack, conns: list[Connection], pids: list[int], warmup_s: float):
        self.st, self.conns, self.pids, self.warmup_s = st, conns, pids, warmup_s
        self.redis = st.redis.client()

    def cpu(self) -> dict[str, float | None]:
        clients = [proc_cpu_seconds(p) for p in self.pids]
        return {
            "orchestrator": self.st.orchestrator.cpu_seconds(),
            "redis": self.st.redis.process.cpu_seconds(),
            "anvil": proc_cpu_seconds(self.st.anvil_pid),
            "clients": sum(c for c in clients if c is not None),
            "bench_main": time.process_time(),
            "machine": machine_cpu_seconds(),
        }

    def keep_up(self, stop: threading.Event) -> None:
        """Validators that keep up, as in a pool: their group moved to the stream's end every
        100 ms. Without them the undelivered submissions pile up through a phase, and the lease
        script counts that backlog entry by entry (up to 10,001 a lease under this bench's
        unlimited budget): Redis, not the orchestrator, is then what the bench measures (seen:
        submit 211/s, EVALSHA 12.5 ms a call, redis-server at 92 % of a core)."""
        r = self.st.redis.client()
        while not stop.wait(0.1):
            with contextlib.suppress(redis.ResponseError):  # no group yet: nothing to count
                r.xgroup_setid(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, "$")
        r.close()

    def redis_commands(self) -> Counter:
        """Calls of each Redis command so far (each command of a pipeline counts, and so do
        those a Lua script runs: the rate limiter's EVALSHA runs TIME, GET and SET)."""
        stats = self.redis.info("commandstats")
        return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})

    def phase(
        self,
        name: str,
        mode: str,
        duration: float,
        total_rate: float | None = None,
        profile: Path | None = None,
    ) -> dict[str, Any]:
        # Between phases: drop what accumulated in the submitted stream (no validator reads
        # it), so every phase starts from the same Redis memory.
        self.redis.xtrim(streams.ROLLOUTS_SUBMITTED, maxlen=0)
        stop = threading.Event()
        validators = threading.Thread(target=self.keep_up, args=(stop,), daemon=True)
        validators.start()
        workers = len(self.st.accounts)
        start = time.monotonic() + 0.5
        end = start + self.warmup_s + duration
        spec = {
            "mode": mode,
            "start": start,
            "end": end,
            "warmup_s": self.warmup_s,
            "rate_per_worker": (total_rate / workers) if total_rate else None,
        }
        for c in self.conns:
            c.send(("phase", spec))
        time.sleep(max(0.0, start + self.warmup_s - time.monotonic()))
        spy = None
        if profile is not None:
            spy = start_py_spy(self.st.orchestrator.proc.pid, duration, profile)
        orch_pid = self.st.orchestrator.proc.pid
        threads0 = thread_cpu_seconds(orch_pid)
        cpu0, t0, cmds0 = self.cpu(), time.monotonic(), self.redis_commands()
        time.sleep(max(0.0, end - time.monotonic()))
        cpu1, window, cmds1 = self.cpu(), time.monotonic() - t0, self.redis_commands()
        stop.set()
        validators.join()
        threads1 = thread_cpu_seconds(orch_pid)
        results = [self.receive(c) for c in self.conns]
        if spy is not None:
            spy.wait(timeout=duration + 60)
        out = self.summarize(name, mode, spec, window, cpu0, cpu1, results)
        requests = out["requests_per_s"] * window
        main_s, others_s = threads1[0] - threads0[0], threads1[1] - threads0[1]
        # Threads alive at both ends (a thread's count is lost when it ends).
        switches = sum(threads1[2][t] - n for t, n in threads0[2].items() if t in threads1[2])
        out["orchestrator_threads"] = {
            "event_loop_thread_cores": round(main_s / window, 3),
            "other_threads_cores": round(others_s / window, 3),
            "context_switches_per_request": round(switches / requests, 2) if requests else None,
            "what": "CPU of the main thread (uvicorn's event loop) and of all the others "
            "(anyio's pool running sync dependencies and routes, asyncio.to_thread running "
            "chain reads); the GIL lets one of them run Python at a time",
        }
        if requests:
            calls = cmds1 - cmds0
            calls.pop("info", None)  # this bench's own
            out["redis_commands_per_request"] = round(sum(calls.values()) / requests, 2)
            out["redis_commands_per_request_by_name"] = {
                k: round(v / requests, 3) for k, v in calls.most_common() if v / requests >= 0.01
            }
        return out

    def receive(self, conn: Connection) -> dict[str, Any]:
        kind, payload = conn.recv()
        if kind != "result":
            raise RuntimeError(payload)
        return payload

    def summarize(
        self,
        name: str,
        mode: str,
        spec: dict[str, Any],
        window: float,
        cpu0: dict[str, float | None],
        cpu1: dict[str, float | None],
        results: list[dict[str, Any]],
    ) -> dict[str, Any]:
        lat: dict[str, list[float]] = defaultdict(list)
        statuses: dict[str, Counter] = defaultdict(Counter)
        extra: Counter = Counter()
        for res in results:
            for route, values in res["latencies"].items():
                lat[route] += values
            for route, counts in res["statuses"].items():
                statuses[route].update({int(k): v for k, v in counts.items()})
            extra.update(res["extra"])
        ok = {route: c.get(200, 0) for route, c in statuses.items()}
        requests = sum(sum(c.values()) for r, c in statuses.items() if r != "submit_from_schedule")
        cpu = {
            k: round(cpu1[k] - cpu0[k], 3)
            for k in cpu0
            if cpu0[k] is not None and cpu1[k] is not None
        }
        if "machine" in cpu:
            # Whatever else ran on the machine meanwhile (py-spy included, in the profile).
            machine = cpu.pop("machine")
            cpu["other_processes"] = round(max(0.0, machine - sum(cpu.values())), 3)
        out: dict[str, Any] = {
            "mode": mode,
            "window_s": round(window, 3),
            "rates_per_s": {r: round(n / window, 1) for r, n in sorted(ok.items())},
            "requests_per_s": round(requests / window, 1),
            "latency": {r: latency_summary(v) for r, v in sorted(lat.items())},
            "statuses": {r: dict(sorted(c.items())) for r, c in sorted(statuses.items())},
            "errors": {
                r: {str(k): v for k, v in sorted(c.items()) if k != 200}
                for r, c in sorted(statuses.items())
                if any(k != 200 for k in c)
            },
            "cpu_s": cpu,
            "cpu_cores": {k: round(v / window, 3) for k, v in cpu.items()},
            "client_cpu_s_self_reported": round(sum(r["client_cpu_s"] for r in results), 3),
            "orchestrator_cpu_ms_per_request": (
                round(1000 * cpu["orchestrator"] / requests, 4)
                if requests and "orchestrator" in cpu
                else None
            ),
        }
        admitted = ok.get("submit", 0) + extra.get("batched_submissions_admitted", 0)
        if admitted and "orchestrator" in cpu:
            # Everything the orchestrator did in the phase (leases, heartbeats included) over
            # the submissions it admitted.
            out["orchestrator_cpu_ms_per_admitted_submission"] = round(
                1000 * cpu["orchestrator"] / admitted, 4
            )
        if spec["rate_per_worker"]:
            out["offered_submissions_per_s"] = round(
                spec["rate_per_worker"] * len(self.st.accounts), 1
            )
        if extra:
            out["extra"] = dict(extra)
            if "batched_submissions_admitted" in extra:
                out["rates_per_s"]["batched_submissions"] = round(
                    extra["batched_submissions_admitted"] / window, 1
                )
        return out


# ---------------------------------------------------------------- profile


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_py_spy(pid: int, duration: float, out: Path) -> subprocess.Popen | None:
    binary = py_spy()
    if binary is None:
        return None
    return subprocess.Popen(
        [binary, "record", "--pid", str(pid), "--duration", str(max(1, int(duration)))]
        + ["--rate", "200", "--format", "raw", "--nonblocking", "--gil", "--full-filenames"]
        + ["--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# Where a sample of the orchestrator's CPU goes, by the file of its frames. Each sample is walked
# from its innermost frame outwards and goes to the first frame that matches one of these (so
# redis-py's socket writes through asyncio count as redis, pydantic called by FastAPI as
# pydantic); frames of asyncio, threading, queue, contextlib and the like match none. The first
# matching key wins, so the narrower keys come first.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    (
        "signature recovery (eth_account, eth_keys, coincurve, keccak)",
        ("eth_account/", "eth_keys/", "coincurve/", "eth_hash/", "eth_utils/", "Crypto/"),
    ),
    ("redis client (redis-py asyncio: commands, replies, socket I/O)", ("redis/",)),
    ("pydantic (validation, serialization)", ("pydantic/", "pydantic_core/")),
    ("json (stdlib)", ("json/",)),
    (
        "chain reads (web3: stake lookups and the ledger-event poll)",
        ("web3/", "requests/", "urllib3/"),
    ),
    ("prometheus metrics", ("prometheus_client/",)),
    (
        "thread pool hand-off (FastAPI runs the sync dependency get_pool, and sync /healthz, "
        "through anyio's worker threads)",
        ("anyio/", "starlette/concurrency.py"),
    ),
    ("BodyGuard (body cap, JSON nesting check)", ("libs/guard/",)),
    ("orchestrator routes and state (own code)", ("services/orchestrator/", "libs/rollout/")),
    ("signing.py (canonical request, timestamp and nonce checks)", ("protocol/",)),
    ("fastapi (dependencies, routing, response models)", ("fastapi/",)),
    ("starlette (request, routing, middleware, responses)", ("starlette/",)),
    ("uvicorn + httptools (HTTP parsing, ASGI glue)", ("uvicorn/", "httptools/")),
    ("logging", ("logging/",)),
]
EVENT_LOOP = "event loop (uvloop's C code: socket reads and writes, callback dispatch)"
THREADS = "worker threads (anyio's pool: get_pool, /healthz; asyncio.to_thread: chain reads)"
# The frame under which every coroutine of the server runs, on the main thread.
LOOP_FRAMES = ("Runner.run (", "run_until_complete (", "run_forever (")


def frame_parts(frame: str) -> tuple[str, str]:
    """('function', 'path:line') from py-spy's `function (path:line)`."""
    name, _, rest = frame.partition(" (")
    return name, rest.rstrip(")")


def categorize(frames: list[str]) -> str:
    for frame in reversed(frames):
        if frame.startswith(LOOP_FRAMES):
            return EVENT_LOOP  # nothing of a coroutine above it: the loop's own C code
        _, where = frame_parts(frame)
        for cat, keys in CATEGORIES:
            if any(k in where for k in keys):
                return cat
    if frames and frames[0].startswith("Thread._bootstrap"):
        return THREADS
    return "other"


def read_profile(path: Path, top: int = 20) -> dict[str, Any] | None:
    """py-spy's collapsed stacks: CPU samples by library and by function (idle excluded)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    by_cat: Counter = Counter()
    self_fn: Counter = Counter()
    incl_fn: Counter = Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        n = int(count_text)
        frames = [f for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        total += n
        by_cat[categorize(frames)] += n
        name, where = frame_parts(frames[-1])
        self_fn[f"{name} ({short(where)})"] += n
        seen = set()
        for frame in frames:
            name, where = frame_parts(frame)
            own = where.startswith(str(ROOT) + "/") and "/site-packages/" not in where
            if own and "orchestrator/cli.py" not in where:
                key = f"{name} ({short(where).rsplit(':', 1)[0]})"
                if key not in seen:
                    seen.add(key)
                    incl_fn[key] += n
    if not total:
        return None

    def pct(counter: Counter, k: int) -> dict[str, float]:
        return {key: round(100 * n / total, 1) for key, n in counter.most_common(k)}

    return {
        "samples": total,
        "what": "py-spy record --gil --nonblocking at 200 Hz on the orchestrator during the "
        "profile phase (a repeat of `submit`): percentages of the samples of whichever thread "
        "held the GIL, i.e. of the Python work that one process can do at a time",
        "by_library_pct": pct(by_cat, len(by_cat)),
        "top_self_pct": pct(self_fn, top),
        "project_functions_inclusive_pct": pct(incl_fn, top),
    }


def short(where: str) -> str:
    """A frame's file without the site-packages, stdlib or checkout prefix."""
    for marker in ("/site-packages/", "/lib/python3.", str(ROOT) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            if marker == "/lib/python3.":
                where = where.split("/", 1)[1]  # "11/asyncio/..." -> "asyncio/..."
            break
    return where


# ---------------------------------------------------------------- run


def run(args: argparse.Namespace) -> dict[str, Any]:
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    started = time.monotonic()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="prime-orch-bench-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        say(f"starting redis, anvil, ledger, {args.workers} staked workers, orchestrator")
        st = start_stack(stack, work, args.workers, args.tokens)
        setup_s = time.monotonic() - started
        cfg = WorkerConfig(
            host="127.0.0.1",
            port=st.port,
            pool_id=st.pool_id,
            policy_version=POLICY_VERSION,
            group_size=st.recipe.group_size,
            tokens=st.recipe.max_new_tokens,
            lease_count=args.lease_count,
            batch=args.batch,
        )
        keys = ["0x" + bytes(a.key).hex() for a in st.accounts]
        check_wire_format(cfg, keys[0])
        sample = SimWorker(keys[0], cfg, seed=0).submission_json("ab" * 12, "reverse:train:7")
        micro = micro_baselines(st.redis.url, st.accounts[0], sample.encode())
        n_clients = max(1, min(args.clients, args.workers))
        conns, procs = [], []
        for i in range(n_clients):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=client_main, args=(i, keys[i::n_clients], cfg, theirs), daemon=True
            )
            p.start()
            stack.callback(p.kill)
            conns.append(mine)
            procs.append(p)
        readies = []
        for c in conns:
            kind, payload = c.recv()
            if kind != "ready":
                raise RuntimeError(payload)
            readies.append(payload)
        say(f"{args.workers} workers registered from {n_clients} client processes")
        runner = Runner(st, conns, [p.pid for p in procs], args.warmup)
        d = args.duration
        phases: dict[str, Any] = {}

        def phase(name: str, mode: str, duration: float, **kw: Any) -> dict[str, Any]:
            say(f"phase {name} ({duration:.0f}s)")
            result = runner.phase(name, mode, duration, **kw)
            say(f"  {json.dumps(result['rates_per_s'])}; errors {json.dumps(result['errors'])}")
            phases[name] = result
            return result

        phase("baseline_healthz", "healthz", d)
        phase("heartbeat", "heartbeat", d)
        submit = phase("submit", "submit", d * 1.5)
        phase("submit_batch", "submit_batch", d)
        phase("open_loop_target", "open_loop", d * 1.5, total_rate=args.target_rate)
        capacity = submit["rates_per_s"].get("submit", 0.0)
        for fraction in args.below_capacity:
            rate = round(fraction * capacity, 1)
            if 0 < rate < args.target_rate:
                name = f"open_loop_{round(100 * fraction)}pct"
                phase(name, "open_loop", d * 1.5, total_rate=rate)
        profile = None
        if not args.no_profile and py_spy() is not None:
            raw = args.profile_raw or work / "profile.txt"
            phase("profile", "submit", d, profile=raw)
            profile = read_profile(raw)
        if not args.no_polled_standing:
            # The same load with each worker's stake re-read on chain every few seconds
            # instead of when a ledger event says it changed.
            say(f"restarting the orchestrator with PRIME_ORCH_STANDING_CACHE_S={POLLED_STANDING_S}")
            st.start_orchestrator(PRIME_ORCH_STANDING_CACHE_S=str(POLLED_STANDING_S))
            phase("submit_standing_polled", "submit", d * 1.5)
        for c in conns:
            c.send(("stop", None))
        for p in procs:
            p.join(10)
        orch_log = st.orchestrator.tail(20)
        orch_alive = st.orchestrator.alive()
    return report(
        args, phases, readies, profile, micro, setup_s, started, orch_alive, orch_log, cfg
    )


def report(
    args: argparse.Namespace,
    phases: dict[str, Any],
    readies: list[dict[str, Any]],
    profile: dict[str, Any] | None,
    micro: dict[str, float],
    setup_s: float,
    started: float,
    orch_alive: bool,
    orch_log: str,
    cfg: WorkerConfig,
) -> dict[str, Any]:
    base = phases["baseline_healthz"]
    hb = phases["heartbeat"]
    sub = phases["submit"]
    batch = phases["submit_batch"]
    target = phases["open_loop_target"]
    healthz_per_s = base["rates_per_s"].get("healthz", 0.0)
    submissions_per_s = sub["rates_per_s"].get("submit", 0.0)
    heartbeats_per_s = hb["rates_per_s"].get("heartbeat", 0.0)
    sub_lat = sub["latency"].get("submit", {})
    target_lat = target["latency"].get("submit_from_schedule", {})
    sign_per_s = [r["sign_per_s"] for r in readies]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    def cpu_ms(phase: dict[str, Any]) -> float | None:
        return phase.get("orchestrator_cpu_ms_per_request")

    target_met = bool(
        target["rates_per_s"].get("submit", 0) >= 0.98 * args.target_rate
        and (target_lat.get("p99_ms") or math.inf) < args.target_p99_ms
    )
    sat_cores = sub["cpu_cores"]
    per_sub = sub.get("orchestrator_cpu_ms_per_admitted_submission")
    summary = [
        f"In `submit` the orchestrator process used {sat_cores.get('orchestrator')} cores "
        f"(one uvicorn process, one event loop: at most one core, the Python work of its "
        f"threads included); redis-server {sat_cores.get('redis')}, anvil "
        f"{sat_cores.get('anvil')}, the {len(readies)} client processes "
        f"{sat_cores.get('clients')}, other processes on the machine "
        f"{sat_cores.get('other_processes')}.",
    ]
    if per_sub:
        summary.append(
            f"It spent {per_sub} ms of CPU per admitted submission (its share of leases and "
            f"heartbeats included): one core caps it near {round(1000 / per_sub)} submissions/s; "
            f"{args.target_rate:.0f}/s needs under {round(1000 / args.target_rate, 3)} ms."
        )
    if sub.get("redis_commands_per_request") and cpu_ms(sub):
        summary.append(
            f"Each request of the `submit` mix ran {sub['redis_commands_per_request']} Redis "
            f"commands, a heartbeat {hb.get('redis_commands_per_request')} (pipelined ones and "
            f"those inside the rate limiter's script count each; by name in the phases); one "
            f"redis-py round trip alone costs {micro['redis_round_trip_us_client_cpu']} us of "
            f"the caller's CPU and one signature recovery {micro['signature_recovery_us_cpu']} "
            f"us, against the {cpu_ms(sub)} ms the orchestrator spent per request."
        )
    polled = phases.get("submit_standing_polled")
    if polled:
        summary.append(
            f"With each worker's stake re-read on chain every {POLLED_STANDING_S:.0f} s "
            f"({args.workers} workers: {args.workers / POLLED_STANDING_S:.0f} lookups/s) "
            f"instead of on ledger events, the same load reached "
            f"{polled['rates_per_s'].get('submit', 0.0)} submissions/s at "
            f"{polled.get('orchestrator_cpu_ms_per_admitted_submission')} ms of CPU each."
        )
    if profile:
        top = list(profile["by_library_pct"].items())[:5]
        summary.append(
            "Its CPU by library (py-spy): " + "; ".join(f"{k} {v} %" for k, v in top) + "."
        )
    where = {
        "summary": summary,
        "process_cpu_cores_in_submit_phase": sat_cores,
        "orchestrator_cpu_ms_per_request": {
            name: cpu_ms(p) for name, p in phases.items() if cpu_ms(p) is not None
        },
        "note": (
            "The orchestrator is one uvicorn process, one event loop: it can use at most one "
            "core, so its CPU per request bounds the rate at about 1000 / (ms per request). "
            "cpu_cores shows each process's share of the machine over the phase's window "
            f"({os.cpu_count()} cores in all, shared by the orchestrator, redis-server, anvil "
            "and the client processes)."
        ),
        "orchestrator_profile": profile,
    }
    out: dict[str, Any] = {
        "workers": args.workers,
        "submissions_per_s": submissions_per_s,
        "heartbeats_per_s": heartbeats_per_s,
        "p50_ms": sub_lat.get("p50_ms"),
        "p99_ms": sub_lat.get("p99_ms"),
        "figures": (
            "submissions_per_s, p50_ms, p99_ms: the `submit` phase, every worker leasing and "
            f"submitting back to back (closed loop, {args.workers} requests in flight), "
            "/v1/submit only; "
            "heartbeats_per_s: the `heartbeat` phase. The open-loop phases give the latency at "
            "a fixed offered rate, counted from each submission's scheduled time."
        ),
        "target": {
            "submissions_per_s": args.target_rate,
            "required_p99_ms": args.target_p99_ms,
            "met": target_met,
            "achieved_submissions_per_s": target["rates_per_s"].get("submit", 0.0),
            "p50_ms": target_lat.get("p50_ms"),
            "p99_ms": target_lat.get("p99_ms"),
            "below_capacity": {
                name: open_loop_summary(p)
                for name, p in phases.items()
                if name.startswith("open_loop_") and name.endswith("pct")
            },
        },
        "batched_submissions_per_s": batch["rates_per_s"].get("batched_submissions", 0.0),
        "baseline": {
            "healthz_per_s": healthz_per_s,
            "healthz_p50_ms": base["latency"].get("healthz", {}).get("p50_ms"),
            "healthz_p99_ms": base["latency"].get("healthz", {}).get("p99_ms"),
            "client_signatures_per_s_per_process": round(sum(sign_per_s) / len(sign_per_s), 1),
            **micro,
            "what": "unsigned GET /healthz on the same server by the same clients (a sync route, "
            "so it also crosses FastAPI's thread pool); sign_request alone in one client "
            "process; one redis-py asyncio round trip and one signature recovery, each alone "
            "in the bench's main process",
        },
        "ratios": {
            "submissions_over_healthz": ratio(submissions_per_s, healthz_per_s),
            "heartbeats_over_healthz": ratio(heartbeats_per_s, healthz_per_s),
            "batched_submissions_over_single": ratio(
                batch["rates_per_s"].get("batched_submissions"), submissions_per_s
            ),
            "orchestrator_cpu_per_submit_request_over_healthz": ratio(cpu_ms(sub), cpu_ms(base)),
            "orchestrator_cpu_per_heartbeat_over_healthz": ratio(cpu_ms(hb), cpu_ms(base)),
            "submissions_over_client_signing_rate": ratio(
                submissions_per_s, sum(sign_per_s) / len(sign_per_s)
            ),
            "submissions_standing_polled_over_default": ratio(
                (polled or {}).get("rates_per_s", {}).get("submit"), submissions_per_s
            ),
            "target_p99_over_healthz_p99": ratio(
                target_lat.get("p99_ms"), base["latency"].get("healthz", {}).get("p99_ms")
            ),
        },
        "where_time_goes": where,
        "phases": phases,
        "config": {
            "clients": max(1, min(args.clients, args.workers)),
            "phase_s": args.duration,
            "warmup_s": args.warmup,
            "lease_count": args.lease_count,
            "batch": args.batch,
            "group_size": cfg.group_size,
            "tokens_per_completion": cfg.tokens,
            "proof_bytes_per_completion": PROOF_BYTES_PER_TOKEN * cfg.tokens,
            "prompt_tokens": PROMPT_TOKENS,
            "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
            "orchestrator_env": ORCHESTRATOR_ENV,
            "rate_limits": "raised to 1e6/s per worker and route (and the chain lookup budget "
            "to 1e4/s) so the bench measures throughput, not the limiter; the limiter's Redis "
            "script still runs on every signed request",
            "stake_checks": "every worker staked on chain; standing cached standing_cache_s "
            "(5 s) as deployed, so each worker's stake is re-read on anvil every 5 s",
            "client": "asyncio (uvloop) with a minimal keep-alive HTTP/1.1 client, one connection "
            "per worker; every request signed by protocol.signing.sign_request",
        },
        "machine_contention": contention(phases),
        "orchestrator_alive_at_end": orch_alive,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "code": code_version(),
        "seconds": round(time.monotonic() - started, 1),
        "setup_s": round(setup_s, 1),
        "command": " ".join(["python -m bench.orchestrator", *sys.argv[1:]]),
    }
    if not orch_alive:
        out["orchestrator_log_tail"] = orch_log
    return out


def code_version() -> dict[str, Any]:
    """The commit measured, and which files the orchestrator runs differ from it."""

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.rstrip("\n") if done.returncode == 0 else ""

    paths = ["services/orchestrator", "protocol", "libs/guard", "libs/rollout", "libs/chain"]
    changed = git("status", "--porcelain", "--", *paths)
    return {
        "commit": git("rev-parse", "HEAD") or None,
        "uncommitted_changes": [line[3:] for line in changed.splitlines()],
    }


def contention(phases: dict[str, Any]) -> dict[str, Any]:
    """How much CPU other processes on the machine took during the phases: the figures are
    only comparable between runs on an otherwise idle machine."""
    other = {n: p["cpu_cores"].get("other_processes") for n, p in phases.items()}
    known = [v for v in other.values() if v is not None]
    busiest = max(known, default=0.0)
    return {
        "other_processes_cores_by_phase": other,
        "max_cores": busiest,
        "note": (
            f"other processes took up to {busiest:.2f} of the {os.cpu_count()} cores during "
            "the phases: the rates are lower, and the latencies higher, than on an idle "
            "machine; the ratios to the baseline of the same run are the figures to compare"
            if busiest > 0.2
            else "the machine was otherwise idle during the phases"
        ),
    }


def open_loop_summary(phase: dict[str, Any]) -> dict[str, Any]:
    """An open-loop run: its offered and achieved rate and latency from the schedule."""
    lat = phase["latency"].get("submit_from_schedule", {})
    return {
        "offered_submissions_per_s": phase.get("offered_submissions_per_s"),
        "achieved_submissions_per_s": phase["rates_per_s"].get("submit", 0.0),
        "p50_ms": lat.get("p50_ms"),
        "p99_ms": lat.get("p99_ms"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=100, help="simulated workers (keys)")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of a phase")
    parser.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds a phase")
    parser.add_argument("--lease-count", type=int, default=8, help="leases per /v1/lease")
    parser.add_argument("--batch", type=int, default=8, help="submissions per batch request")
    parser.add_argument("--tokens", type=int, default=None, help="max_new_tokens (recipe's)")
    parser.add_argument("--target-rate", type=float, default=1000.0)
    parser.add_argument("--target-p99-ms", type=float, default=50.0)
    parser.add_argument(
        "--below-capacity",
        type=lambda text: [float(x) for x in text.split(",") if x],
        default=[0.5, 0.75],
        help="open-loop rates as fractions of the saturated one (comma-separated), run when "
        "under the target",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy phase")
    parser.add_argument(
        "--no-polled-standing",
        action="store_true",
        help="skip the phase with each stake re-read on chain every 5 s",
    )
    parser.add_argument(
        "--profile-raw", type=Path, default=None, help="keep py-spy's collapsed stacks here"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"workers {result['workers']}: {result['submissions_per_s']} submissions/s "
        f"(p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms), "
        f"{result['heartbeats_per_s']} heartbeats/s, baseline {result['baseline']['healthz_per_s']}"
        f" healthz/s; target met: {result['target']['met']}; wrote {args.out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
