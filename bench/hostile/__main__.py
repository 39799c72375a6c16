"""The hostile swarm: a local training run with honest workers beside one cheating worker of
each kind (tests/support/cheating_worker.py) and a flooder of malformed and replayed requests,
against a clean run of the same settings.

    python -m bench.hostile [--steps N]       (make hostile)

Writes bench/results/hostile.json and bench/results/hostile.png (both reward curves). The
checks: every cheater's submissions rejected and the cheater slashed on chain, no honest
worker rejected for anything but a stale policy (refused, never slashed), the flooder answered
with 4xx only and the orchestrator alive, and the hostile run's reward as good as the clean
run's (mean of the last 5 steps within 0.05).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
from eth_account import Account

from prime_swarm.deploy.local.cli import prepare_model
from prime_swarm.deploy.local.network import LocalNetwork, new_run_dir
from prime_swarm.deploy.local.settings import LocalNetworkSettings
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import Heartbeat, Verdict, VerifiedRollout, normal_address
from prime_swarm.protocol.signing import WorkerAuth
from prime_swarm.services.trainer import progress
from tests.support.cheating_worker import KINDS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# A program, not an import: the local network starts it by path in place of `prime-worker`.
CHEATER = ROOT / "tests" / "support" / "cheating_worker.py"
# Each cheater answers this many leases, two to a batch (a replay needs two), then stops.
CHEATER_ENV = {"PRIME_WORKER_MAX_ROLLOUTS": "6", "PRIME_WORKER_LEASE_BATCH": "2"}


class Flooder(threading.Thread):
    """Malformed, oversized, deeply nested, unsigned, wrongly signed and replayed requests."""

    def __init__(self, url: str, pool_id: int) -> None:
        super().__init__(daemon=True)
        self.url, self.pool_id = url.rstrip("/"), pool_id
        self.status: Counter[str] = Counter()
        self.stop = threading.Event()

    def _send(self, http: httpx.Client, method: str, path: str, **kw: object) -> None:
        try:
            r = http.request(method, self.url + path, **kw)  # type: ignore[arg-type]
            self.status[str(r.status_code)] += 1
        except httpx.HTTPError as exc:
            self.status[type(exc).__name__] += 1

    def run(self) -> None:
        account = Account.create()
        hb = Heartbeat(worker=account.address, pool_id=self.pool_id)
        hb = hb.model_dump_json().encode()
        captured: list[httpx.Request] = []
        signed = httpx.Client(
            auth=WorkerAuth(account), timeout=10, event_hooks={"request": [captured.append]}
        )
        with httpx.Client(timeout=10) as http:
            while not self.stop.is_set():
                json_h = {"Content-Type": "application/json"}
                self._send(http, "POST", "/v1/submit/batch", content=b"{not json", headers=json_h)
                self._send(http, "POST", "/v1/submit/batch", content=b"[" * 20000, headers=json_h)
                self._send(http, "POST", "/v1/lease", content=b"x" * (8 << 20), headers=json_h)
                self._send(http, "POST", "/v1/heartbeat", content=hb, headers=json_h)  # unsigned
                self._send(signed, "POST", "/v1/heartbeat", content=hb, headers=json_h)
                if captured:  # the same signed bytes again: the nonce is spent
                    req = captured[-1]
                    headers = {k: v for k, v in req.headers.items() if k != "content-length"}
                    self._send(http, "POST", "/v1/heartbeat", content=req.content, headers=headers)
                self.stop.wait(0.5)
        signed.close()


def verdicts(net: LocalNetwork) -> dict[str, dict[str, object]]:
    """Per worker (lower-case address): accepted count and rejections by reason."""
    assert net.redis is not None
    r = net.redis.client()
    out: dict[str, dict[str, object]] = defaultdict(lambda: {"accepted": 0, "rejected": Counter()})
    try:
        for _, fields in r.xrange(streams.ROLLOUTS_VERIFIED):
            v = streams.decode(VerifiedRollout, fields)
            out[v.worker]["accepted"] += 1  # type: ignore[operator]
        for _, fields in r.xrange(streams.ROLLOUTS_REJECTED):
            d = streams.decode(Verdict, fields)
            out[d.worker]["rejected"][str(d.reason)] += 1  # type: ignore[index]
    finally:
        r.close()
    return out


def run(s: LocalNetworkSettings, hostile: bool) -> dict[str, object]:
    run_dir = new_run_dir(s.runs_dir)
    net = LocalNetwork(s, prepare_model(s), run_dir)
    cheaters: dict[str, str] = {}
    flooder = None
    try:
        net.start()
        honest = [normal_address(a) for a in net.topo.workers]
        if hostile:
            for kind in KINDS:
                address = net.add_worker([sys.executable, str(CHEATER), kind], env=CHEATER_ENV)
                cheaters[normal_address(address)] = kind
            flooder = Flooder(net.topo.orchestrator_url, net.topo.pool_id)
            flooder.start()
        deadline = time.monotonic() + s.timeout_s
        trainer = net.procs["trainer"]
        while trainer.alive():
            if time.monotonic() > deadline:
                raise TimeoutError("the run did not finish")
            for name, p in list(net.procs.items()):
                if name not in ("trainer",) and not p.alive():
                    net.retire(name)  # a cheater done with its rollouts (or stopped by refusals)
            time.sleep(1.0)
        rows = progress.read(net.progress_file)
        alive = httpx.get(net.topo.orchestrator_url + "/healthz", timeout=10).status_code == 200
        if flooder is not None:
            flooder.stop.set()
            flooder.join(30)
        net.stop_workers()
        net.stop_validators()  # each flushes its queued attestations and slashes first
        books = verdicts(net)
        ledger = LedgerClient(net.topo.rpc_url, net.topo.ledger, account=None, timeout=30)
        slashed = {normal_address(e.worker) for e in ledger.worker_slashed_events(net.topo.pool_id)}
    finally:
        net.stop()
    result: dict[str, object] = {
        "rewards": [r.mean_reward for r in rows],
        "run_dir": str(run_dir),
        "honest": {a: _plain(books.get(a)) for a in honest},
    }
    if hostile:
        result["cheaters"] = {
            kind: {"worker": a, **_plain(books.get(a)), "slashed": a in slashed}
            for a, kind in cheaters.items()
        }
        result["honest_slashed"] = sorted(set(honest) & slashed)
        result["flood"] = {
            "status": dict(flooder.status) if flooder else {},
            "orchestrator_alive": alive,
        }
    return result


def _plain(entry: dict[str, object] | None) -> dict[str, object]:
    entry = entry or {"accepted": 0, "rejected": Counter()}
    return {"accepted": entry["accepted"], "rejected": dict(entry["rejected"])}  # type: ignore[arg-type]


def plot(clean: list[float], hostile: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(clean) + 1), clean, marker=".", label="clean run")
    ax.plot(range(1, len(hostile) + 1), hostile, marker=".", label="hostile swarm")
    ax.set_xlabel("trainer step")
    ax.set_ylabel("rollout mean reward")
    ax.set_title("Reward with and without cheaters and a flooder")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="trainer steps of each run")
    p.add_argument("--out", type=Path, default=RESULTS / "hostile.json")
    args = p.parse_args()
    overrides = {"steps": args.steps} if args.steps else {}
    s = LocalNetworkSettings(quiet=True, **overrides)  # type: ignore[arg-type]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print("clean run ...", flush=True)
    clean = run(s, hostile=False)
    print("hostile run ...", flush=True)
    hostile = run(s, hostile=True)
    cheaters = hostile["cheaters"]  # type: ignore[index]
    last = 5
    clean_end = sum(clean["rewards"][-last:]) / last  # type: ignore[index]
    hostile_end = sum(hostile["rewards"][-last:]) / last  # type: ignore[index]
    honest_bad = {
        a: {r: n for r, n in v["rejected"].items() if r != "stale_policy"}  # type: ignore[union-attr]
        for a, v in hostile["honest"].items()  # type: ignore[union-attr]
    }
    flood = hostile["flood"]  # type: ignore[index]
    checks = {
        # Every cheating submission rejected; the replayer's first submission was genuine work
        # (it is what it replays), so one acceptance is its due.
        "every_cheater_rejected": all(
            c["rejected"] and c["accepted"] <= (1 if kind == "replayed_submission" else 0)  # type: ignore[operator]
            for kind, c in cheaters.items()  # type: ignore[union-attr]
        ),
        "every_cheater_slashed": all(c["slashed"] for c in cheaters.values()),  # type: ignore[union-attr]
        "no_honest_rejected_for_cheating": not any(honest_bad.values()),
        "no_honest_slashed": not hostile["honest_slashed"],  # type: ignore[index]
        "flood_only_4xx": all(
            k.startswith("4")
            for k in flood["status"]  # type: ignore[index]
        ),
        "orchestrator_alive": flood["orchestrator_alive"],  # type: ignore[index]
        "reward_as_good_as_clean": hostile_end >= clean_end - 0.05,
    }
    result = {
        "checks": checks,
        "passed": all(checks.values()),
        "reward_last5": {"clean": round(clean_end, 4), "hostile": round(hostile_end, 4)},
        "cheaters": cheaters,
        "honest": hostile["honest"],
        "flood": flood,
        "rewards": {"clean": clean["rewards"], "hostile": hostile["rewards"]},
        "runs": {"clean": clean["run_dir"], "hostile": hostile["run_dir"]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(clean["rewards"], hostile["rewards"], args.out.with_suffix(".png"))  # type: ignore[arg-type]
    print(json.dumps({"checks": checks, "reward_last5": result["reward_last5"]}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
