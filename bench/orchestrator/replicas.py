"""Orchestrator replicas behind HAProxy under a lease storm: `make bench-orchestrator`, part two.

For 1, 2 and 3 replicas in turn (each a `prime-orchestrator` process on one Redis, with HAProxy
in front when there are several: deploy/local/pool.py `start_pool(replicas=...)`), `--workers`
simulated workers - staked on a real anvil chain, each request EIP-191 signed - lease and answer
leases as fast as they can through the balancer for `--duration` seconds. A drain in this
process plays the validators (reads and acknowledges the submitted stream), so the in-flight
budget frees as work is taken, as in a pool. In the last run, one replica is SIGKILLed halfway
and started again two seconds later, as a supervisor would.

Checked, from what the workers received and what Redis holds:
- double_grants: a lease id, a (worker, work id) or a task handed out twice;
- budget_exceeded: samples (every 20 ms, one Lua snapshot, the grant script's own count) with
  more groups in flight than `max_in_flight_groups`; share_exceeded: a worker holding more open
  leases than its fair share;
- lost: a submission a worker was told is in (200) that the stream does not hold; duplicated:
  one held twice. A request that died with the replica is retried by the worker (as
  services/worker/client.py does: 5xx and broken connections, with backoff), and a retried
  answer is recognised (services/orchestrator/state.py `_ADMIT`).

Reported per replica count: submissions_per_s (admitted, through the balancer), the
orchestrators' CPU-seconds per signed submission (all replicas together, and per replica), and
the HAProxy, Redis and client CPU beside them: this machine has 2 cores for all of it.

    python -m bench.orchestrator.replicas [--workers 200] [--clients 3] [--duration 15]

Writes `orchestrators` into bench/results/ha.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from eth_account import Account

from prime_swarm.deploy.local.pool import start_pool
from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.streams.connection import connect_async
from prime_swarm.libs.streams.consumer import ensure_group
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    PROTOCOL_VERSION,
    LeaseRequest,
    SubmittedRollout,
    normal_address,
)
from prime_swarm.protocol.signing import sign_request
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.orchestrator.state import OPEN_LEASES, LeaseBook

from .single import (
    MIN_STAKE,
    ORCHESTRATOR_ENV,
    POLICY_VERSION,
    PROMPT_TOKENS,
    TRAINER,
    HttpConn,
    completions_json,
    stake_workers,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "ha.json"
MAX_IN_FLIGHT = 300  # below 200 workers x their share (1.5 x 300 / 200 = 3): the budget binds
LEASE_COUNT = 8
LEASE_TTL_S = 600  # nothing expires during a run: a task seen twice is a double grant
RETRIES = 6  # the worker's budget for a request that failed without an answer or with a 5xx


async def _post(http: HttpConn, account: Any, path: str, body: bytes) -> tuple[int, bytes]:
    headers = sign_request(account, "POST", path, "", body)
    try:
        return await asyncio.wait_for(http.request("POST", path, body, headers), 30.0)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
        http.close()
        return 0, b""


async def _worker(
    key: str, port: int, pool_id: int, end: float, seed: int, out: dict[str, Any]
) -> None:
    """Lease a batch, answer each lease, again, until `end`; retry what died unanswered."""
    account = Account.from_key(key)
    http = HttpConn("127.0.0.1", port)
    completions = completions_json(2, 8, seed)
    prompt = json.dumps(list(range(1, PROMPT_TOKENS + 1)))
    lease_body = (
        LeaseRequest(
            worker=account.address, pool_id=pool_id, policy_version=POLICY_VERSION,
            count=LEASE_COUNT,
        ).model_dump_json().encode()
    )  # fmt: skip
    stock: list[dict[str, Any]] = []
    while time.monotonic() < end:
        if not stock:
            status, data = await _post(http, account, "/v1/lease", lease_body)
            out["statuses"][f"lease {status}"] += 1
            if status != 200:
                await asyncio.sleep(0.05)
                continue
            reply = json.loads(data)
            granted = reply["leases"]
            out["grants"] += [(g["lease_id"], g["worker"], g["work_id"], g["task_id"])
                              for g in granted]  # fmt: skip
            stock.extend(granted)
            if not granted:
                await asyncio.sleep(float(reply.get("retry_after_s") or 0.05))
            continue
        lease = stock.pop()
        body = (
            f'{{"protocol_version":{PROTOCOL_VERSION},"lease_id":"{lease["lease_id"]}",'
            f'"worker":"{account.address}","pool_id":{pool_id},'
            f'"task_id":{json.dumps(lease["task_id"])},"policy_version":{POLICY_VERSION},'
            f'"backend":"hf","precision":"bf16","prompt_token_ids":{prompt},'
            f'"completions":{completions}}}'
        ).encode()
        for attempt in range(RETRIES + 1):
            status, data = await _post(http, account, "/v1/submit", body)
            out["statuses"][f"submit {status}"] += 1
            if status == 200:
                out["acked"].append(json.loads(data)["submission_id"])
                break
            if status not in (0, 502, 503, 504) or attempt == RETRIES:
                out["refused"][str(status)] += 1
                break
            out["retries"] += 1
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
    http.close()


def _client(keys: list[str], port: int, pool_id: int, start: float, end: float,
            conn: Connection) -> None:  # fmt: skip
    out: dict[str, Any] = {
        "grants": [], "acked": [], "statuses": Counter(), "refused": Counter(), "retries": 0,
    }  # fmt: skip

    async def main() -> None:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        await asyncio.gather(
            *(_worker(k, port, pool_id, end, random.randrange(1 << 30), out) for k in keys)
        )

    cpu0 = time.process_time()
    asyncio.run(main())
    out["cpu_s"] = time.process_time() - cpu0
    conn.send(out)


async def _watch(leases: LeaseBook, workers: Sequence[str], share: int, until: float,
                 seen: dict[str, Any]) -> None:  # fmt: skip
    """Every 20 ms: groups in flight (the grant script's own count, atomic) and the largest
    number of open leases one worker holds."""
    r = leases.redis
    keys = [OPEN_LEASES.format(worker=normal_address(w)) for w in workers]
    busiest = r.register_script(
        "local m = 0 for _, k in ipairs(KEYS) do "
        "local n = redis.call('ZCOUNT', k, '(' .. ARGV[1], '+inf') if n > m then m = n end end "
        "return m"
    )
    while time.monotonic() < until:
        in_flight = await leases.in_flight()
        held = int(await busiest(keys=keys, args=[time.time()]))
        seen["samples"] += 1
        seen["max_in_flight"] = max(seen["max_in_flight"], in_flight)
        seen["max_held"] = max(seen["max_held"], held)
        seen["budget_exceeded"] += in_flight > MAX_IN_FLIGHT
        seen["share_exceeded"] += held > share
        await asyncio.sleep(0.02)


async def _drain(url: str, until: float) -> int:
    """The validators' part: take what was submitted and acknowledge it."""
    r = connect_async(url, socket_timeout=10)
    taken = 0
    try:
        while time.monotonic() < until:
            got = await r.xreadgroup(
                streams.VALIDATOR_GROUP, "drain", {streams.ROLLOUTS_SUBMITTED: ">"},
                count=1000, block=50,
            )  # fmt: skip
            ids = [entry_id for _, entries in got for entry_id, _ in entries]
            if ids:
                await r.xack(streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, *ids)
                taken += len(ids)
    finally:
        await r.aclose()
    return taken


def run_storm(args: argparse.Namespace, replicas: int, kill: bool) -> dict[str, Any]:
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="storm-") as tmp:
        work = Path(tmp)
        node = stack.enter_context(Anvil(accounts=2))
        server = RedisServer(work / "redis", work / "logs")
        stack.callback(server.stop)
        env = {
            **ORCHESTRATOR_ENV,
            "PRIME_ORCH_MAX_IN_FLIGHT_GROUPS": str(MAX_IN_FLIGHT),
            "PRIME_ORCH_LEASE_TTL_S": str(LEASE_TTL_S),
            "PRIME_RECIPE_GROUP_SIZE": "2",
            "PRIME_RECIPE_MAX_NEW_TOKENS": "8",
        }
        pool = stack.enter_context(
            start_pool(
                work / "logs", node.rpc_url, server.url, node.dev_accounts(1)[0], TRAINER,
                min_stake_wei=MIN_STAKE, placeholder_version=POLICY_VERSION, env=env,
                timeout_s=60, replicas=replicas,
            )
        )  # fmt: skip
        accounts = stake_workers(node.rpc_url, pool.ledger, pool.pool_id, args.workers)
        r = server.client()
        ensure_group(r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP)
        ensure_group(r, streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP)
        port = int(pool.url.rsplit(":", 1)[1])
        # Register every worker first (not counted): a storm is of leases and answers.
        _register_all([a.key.hex() for a in accounts], port, pool.pool_id)
        cpu0 = _cpu(pool)
        start = time.monotonic() + 2.0
        end = start + args.duration
        keys = [a.key.hex() for a in accounts]
        ctx = mp.get_context("fork")
        pipes, procs = [], []
        for i in range(args.clients):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_client,
                args=(keys[i :: args.clients], port, pool.pool_id, start, end, child),
            )
            p.start()
            pipes.append(parent)
            procs.append(p)
        settings = OrchestratorSettings(
            ledger_address=pool.ledger, pool_id=pool.pool_id,
            max_in_flight_groups=MAX_IN_FLIGHT, lease_ttl_s=LEASE_TTL_S,
        )  # fmt: skip
        share = min(settings.max_open_leases_per_worker,
                    -(-int(settings.lease_spread * MAX_IN_FLIGHT) // args.workers))  # fmt: skip
        seen: dict[str, Any] = Counter(max_in_flight=0, max_held=0)
        killed: dict[str, Any] = {}

        async def main() -> int:
            rc = connect_async(server.url, socket_timeout=10)

            async def floor(worker: str) -> int:
                return 0

            leases = LeaseBook(rc, settings, floor)
            tasks = [
                asyncio.create_task(_watch(leases, [a.address for a in accounts], share,
                                           end + 1.0, seen)),
                asyncio.create_task(_drain(server.url, end + 3.0)),
            ]  # fmt: skip
            if kill:
                await asyncio.sleep(max(0.0, start + args.duration / 2 - time.monotonic()))
                victim = pool.processes[1]
                killed.update(replica=1, at_s=round(time.monotonic() - start, 2))
                # What the victim used dies with it: counted here, added to its successor's.
                cpu0["orchestrator-1"] -= victim.cpu_seconds() or 0.0
                victim.kill()
                await asyncio.sleep(2.0)
                await asyncio.to_thread(pool.restart, 60.0, 1)
                killed["back_after_s"] = round(time.monotonic() - start - killed["at_s"], 2)
            await tasks[0]
            taken = await tasks[1]
            await rc.aclose()
            return taken

        taken = asyncio.run(main())
        outs = [p.recv() for p in pipes]
        for p in procs:
            p.join(60)
        cpu = _cpu(pool)
        held = [
            streams.decode(SubmittedRollout, f).submission_id
            for _, f in r.xrange(streams.ROLLOUTS_SUBMITTED)
        ]
        r.close()
    grants = [g for o in outs for g in o["grants"]]
    acked = [s for o in outs for s in o["acked"]]
    held_count = Counter(held)
    admitted = len(held)
    orch_cpu = sum(cpu[k] - cpu0[k] for k in cpu if k.startswith("orchestrator"))
    return {
        "replicas": replicas,
        "workers": args.workers,
        "duration_s": args.duration,
        "submissions": admitted,
        "submissions_per_s": round(admitted / args.duration, 1),
        "leases_granted": len(grants),
        "double_grants": (
            len(grants)
            - len({g[0] for g in grants})
            + len(grants)
            - len({(g[1], g[2]) for g in grants})
            + len(grants)
            - len({g[3] for g in grants})
        ),
        "budget_exceeded": seen["budget_exceeded"],
        "max_in_flight": seen["max_in_flight"],
        "max_in_flight_groups": MAX_IN_FLIGHT,
        "share": share,
        "share_exceeded": seen["share_exceeded"],
        "max_held_by_one_worker": seen["max_held"],
        "monitor_samples": seen["samples"],
        "acked": len(acked),
        "lost": len(set(acked) - set(held_count)),
        "duplicated": sum(1 for n in held_count.values() if n > 1),
        "drained": taken,
        "retries": sum(o["retries"] for o in outs),
        "refused": dict(sum((o["refused"] for o in outs), Counter())),
        "statuses": dict(sum((o["statuses"] for o in outs), Counter())),
        "killed": killed or None,
        "cpu_s": {k: round(cpu[k] - cpu0[k], 2) for k in cpu},
        "client_cpu_s": round(sum(o["cpu_s"] for o in outs), 2),
        "orchestrator_cpu_ms_per_submission": (
            round(1000 * orch_cpu / admitted, 3) if admitted else None
        ),
        "orchestrator_cpu_ms_per_submission_per_replica": (
            round(1000 * orch_cpu / admitted / replicas, 3) if admitted else None
        ),
    }


def _cpu(pool: Any) -> dict[str, float]:
    named = {
        (f"orchestrator-{i}" if pool.replicas > 1 else "orchestrator"): p
        for i, p in enumerate(pool.processes)
    }
    if pool.balancer is not None:
        named["haproxy"] = pool.balancer.process
    # A restarted replica is a new process: what the dead one used is lost with it, so the
    # per-submission figure of the kill run is a floor.
    return {k: p.cpu_seconds() or 0.0 for k, p in named.items()}


def _register_all(keys: list[str], port: int, pool_id: int) -> None:
    async def one(key: str) -> None:
        account = Account.from_key(key)
        body = json.dumps(
            {"protocol_version": PROTOCOL_VERSION, "worker": account.address, "pool_id": pool_id}
        ).encode()
        http = HttpConn("127.0.0.1", port)
        for _ in range(10):
            status, _ = await _post(http, account, "/v1/register", body)
            if status == 200:
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"registration answered {status}")
        http.close()

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=200, help="simulated workers (keys)")
    parser.add_argument("--clients", type=int, default=3, help="client processes")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of each storm")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs = []
    for replicas in (1, 2, 3):
        print(f"storm: {args.workers} workers, {replicas} replica(s)", flush=True)
        runs.append(run_storm(args, replicas, kill=replicas == 3))
        print(json.dumps({k: runs[-1][k] for k in (
            "submissions_per_s", "double_grants", "budget_exceeded", "lost", "killed")}),
            flush=True)  # fmt: skip
    last = runs[-1]
    result = {
        "replicas": 3,
        "workers": args.workers,
        "double_grants": sum(r["double_grants"] for r in runs),
        "budget_exceeded": sum(r["budget_exceeded"] for r in runs),
        "share_exceeded": sum(r["share_exceeded"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "duplicated": sum(r["duplicated"] for r in runs),
        "submissions_per_s": {str(r["replicas"]): r["submissions_per_s"] for r in runs},
        "orchestrator_cpu_ms_per_submission": {
            str(r["replicas"]): r["orchestrator_cpu_ms_per_submission"] for r in runs
        },
        "replica_killed_mid_storm": last["killed"],
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": "python -m bench.orchestrator.replicas " + " ".join(argv or []),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc["orchestrators"] = result
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out} (orchestrators)")
    failed = [k for k in ("double_grants", "budget_exceeded", "share_exceeded", "lost",
                          "duplicated") if result[k]]  # fmt: skip
    if failed:
        print(f"FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
