"""The orchestrator's status API and page against a real orchestrator, Redis, anvil and relay.

The counters are fed for real: workers register, lease and submit over signed HTTP (the
orchestrator counts), verdicts are counted through the validator's own function on the
submissions the orchestrator queued, and trainer steps go through the trainer's own publish.
Then the page is driven in headless Chromium and what it shows is checked against the API.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    CompletionSample,
    Heartbeat,
    LeaseRequest,
    RegisterRequest,
    RolloutSubmission,
    StepProgress,
    SubmittedRollout,
    Verdict,
)
from prime_swarm.services.orchestrator.state import EJECTED
from prime_swarm.services.trainer import progress
from prime_swarm.services.validator import stats
from prime_swarm.services.worker.client import OrchestratorClient

StartPool = Callable[..., AbstractContextManager[Any]]
TRAINER = "0x" + "11" * 20
DEAD_RELAY = "http://127.0.0.1:1"
# Worker-chosen text the page must show as text: were it parsed as markup, the image's
# handler would open a dialog and a script element would appear.
HOSTILE = '<img src=x onerror="alert(1)"><script>alert(2)</script> & "H100"'
VALIDATOR = "0x" + "22" * 20


PROOF_DETAIL = "proof error 1.31 ulp against this validator's bf16 recomputation > 0.3"


@dataclass
class Fed:
    live: Any
    relay: RelayProcess
    busy: str  # the member: hostile hardware, leases, submissions, verdicts
    idle: str  # registered with no hardware string, one open lease
    ejected: str  # ejected for silence, never registered again

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.live.url + path, timeout=10)


def step(n: int) -> StepProgress:
    return StepProgress(
        step=n,
        version=n,
        mean_reward=0.1 * n,
        reward_task=0.1 * n,
        groups=2,
        policy_lag_mean=0.5,
        policy_lag_max=1,
        stale_dropped=0,
        accepted_total=n,
        rejected_total=0,
        loss=0.0,
        clip_frac=0.0,
        seconds=1.0,
        wall=float(n),
    )


def feed(live: Any) -> str:
    """Feed every counter for real; returns the second worker's address."""
    busy = OrchestratorClient(live.url, live.member, timeout_s=10, retry_budget=0)
    who = {"worker": live.member.address, "pool_id": live.pool_id}
    busy.register(RegisterRequest(**who, hardware=HOSTILE, device="cpu"))
    leases = busy.lease(LeaseRequest(**who, policy_version=5, count=3)).leases
    assert len(leases) == 3
    for lease in leases[:2]:
        busy.submit(
            RolloutSubmission(
                lease_id=lease.lease_id,
                task_id=lease.task_id,
                policy_version=5,
                prompt_token_ids=[1, 2, 3],
                completions=[
                    CompletionSample(token_ids=[4, 5], finish_reason="eos", proof=b"p")
                    for _ in range(lease.group_size)
                ],
                **who,
            )
        )
    other_account = live.new_member()
    idle = OrchestratorClient(live.url, other_account, timeout_s=10, retry_budget=0)
    other = {"worker": other_account.address, "pool_id": live.pool_id}
    idle.register(RegisterRequest(**other))
    idle.lease(LeaseRequest(**other, policy_version=5, count=1))
    idle.heartbeat(Heartbeat(**other))

    # The validator's verdicts on the two queued submissions: one accepted, one not, counted
    # by its own function in one transaction, as services/validator/loop.py does.
    queued = [
        streams.decode(SubmittedRollout, fields)
        for _, fields in live.redis.xrange(streams.ROLLOUTS_SUBMITTED)
    ]
    assert len(queued) == 2
    pipe = live.redis.pipeline(transaction=True)
    for entry, accepted in zip(queued, (True, False), strict=True):
        units = sum(len(c.token_ids) for c in entry.submission.completions) if accepted else 0
        verdict = Verdict(
            submission_id=entry.submission_id,
            lease_id=entry.lease.lease_id,
            worker=entry.submission.worker,
            pool_id=live.pool_id,
            accepted=accepted,
            reason=None if accepted else "bad_proof",
            detail="" if accepted else PROOF_DETAIL,
            units=units,
            validator=VALIDATOR,
        )
        stats.count_verdict(pipe, verdict)
    pipe.execute()
    for n in range(1, 6):
        progress.publish(live.redis, step(n))
    return other_account.address


@pytest.fixture(scope="module")
def fed(
    anvil: Anvil,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    start_live_pool: StartPool,
) -> Iterator[Fed]:
    logs: Path = tmp_path_factory.mktemp("status")
    relay = RelayProcess(["origin", "--trainer", TRAINER], logs / "origin").wait_healthy()
    env = {
        "PRIME_ORCH_RELAYS": json.dumps([relay.url, DEAD_RELAY]),
        "PRIME_ORCH_STATUS_CACHE_S": "0",  # each request sees the state it follows
        "PRIME_ORCH_STATUS_MAX_WORKERS": "3",
        "PRIME_ORCH_HEARTBEAT_TTL_S": "600",  # both workers stay live for the whole module
    }
    try:
        with start_live_pool(anvil, redis_server.url, logs, env) as live:
            idle = feed(live)
            ejected = Account.create().address
            record = {"at": time.time(), "reason": "no heartbeat for 600 s", "stake": 1, "tx": "0x"}
            live.redis.hset(EJECTED, ejected.lower(), json.dumps(record))
            yield Fed(live, relay, live.member.address, idle, ejected)
    finally:
        relay.stop()


def test_status_reports_the_pool_workers_relays_and_rewards(fed: Fed) -> None:
    reply = fed.get("/v1/status")
    assert reply.status_code == 200, reply.text
    s = reply.json()
    assert s["pool_id"] == fed.live.pool_id
    assert (s["policy_version"], s["trainer_step"], s["min_version"]) == (5, 5, 3)
    assert (s["workers_registered"], s["workers_live"]) == (2, 2)
    assert s["in_flight_groups"] == 2  # one open lease each; no validator group yet
    assert s["throughput_window_s"] == 300

    rows = {w["worker"]: w for w in s["workers"]}
    # Last seen first, the ejected one after the roster.
    assert [w["worker"] for w in s["workers"]] == [fed.idle, fed.busy, fed.ejected]
    assert not s["workers_truncated"]
    busy = rows[fed.busy]
    assert busy["hardware"] == HOSTILE and busy["backend"] == "hf" and busy["device"] == "cpu"
    assert busy["live"] and busy["registered"] and not busy["ejected"]
    assert (busy["leases"], busy["submitted"], busy["accepted"], busy["units"]) == (3, 2, 1, 4)
    assert busy["rejected"] == {"bad_proof": 1}
    # The statistic that decided, and its limit: an honest-stack problem reads apart from a cheat.
    assert busy["why"] == {"bad_proof": PROOF_DETAIL}
    # Two submissions and one acceptance in the last few seconds of a window of 5-6 minutes.
    assert 2 * 60 / 360 <= busy["submitted_per_min"] <= 2 * 60 / 300
    assert 60 / 360 <= busy["accepted_per_min"] <= 60 / 300
    idle = rows[fed.idle]
    assert idle["hardware"] == "" and idle["leases"] == 1 and idle["submitted"] == 0
    assert idle["accepted"] == 0 and idle["rejected"] == {} and idle["live"]
    gone = rows[fed.ejected]
    assert gone["ejected"] and not gone["registered"] and not gone["live"]
    assert gone["last_seen"] is None
    assert gone["ejection"] == "no heartbeat for 600 s"

    relays = {r["url"]: r for r in s["relays"]}
    assert relays[fed.relay.url]["healthy"] and relays[fed.relay.url]["status_code"] == 200
    assert relays[fed.relay.url]["latest_version"] is None  # an origin with nothing uploaded
    dead = relays[DEAD_RELAY]
    assert not dead["healthy"] and dead["status_code"] is None and dead["error"]

    assert [p["step"] for p in s["rewards"]] == [1, 2, 3, 4, 5]
    assert [p["mean_reward"] for p in s["rewards"]] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert all(abs(p["at"] - time.time()) < 120 for p in s["rewards"])


def test_one_worker_for_the_workers_status_line(fed: Fed) -> None:
    reply = fed.get(f"/v1/status/workers/{fed.busy.lower()}")
    assert reply.status_code == 200, reply.text
    one = reply.json()
    assert one["pool_id"] == fed.live.pool_id and one["policy_version"] == 5
    listed = {w["worker"]: w for w in fed.get("/v1/status").json()["workers"]}[fed.busy]
    mine = one["worker"]
    for field in ("worker", "hardware", "leases", "submitted", "accepted", "rejected", "units"):
        assert mine[field] == listed[field], field
    assert fed.get(f"/v1/status/workers/{fed.ejected}").json()["worker"]["ejected"]
    # The worker's own client (what its status line reads) parses the same answer.
    client = OrchestratorClient(fed.live.url, Account.create(), timeout_s=10, retry_budget=0)
    parsed = client.worker_status(fed.busy).worker.model_dump(mode="json")
    # Rates over a window that moves between the two requests (0.376 against 0.377, 0.189
    # against 0.19 seen): equal within a tolerance, everything else exactly.
    rates = [k for k in mine if k.endswith("_per_min")]
    assert rates == ["submitted_per_min", "accepted_per_min"]
    for rate in rates:
        assert parsed.pop(rate) == pytest.approx(mine[rate], rel=0.05), rate
    assert parsed == {k: v for k, v in mine.items() if k not in rates}

    unknown = fed.get(f"/v1/status/workers/{Account.create().address}")
    assert unknown.status_code == 404 and unknown.json()["detail"]["reason"] == "unknown"
    for bad in ("0x1234", "0x" + "zz" * 20, "not-an-address", "0x" + "ab" * 21):
        malformed = fed.get(f"/v1/status/workers/{bad}")
        assert malformed.status_code == 422, bad
        assert malformed.json()["detail"]["reason"] == "malformed"


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


# What each worker row shows, read in the browser: column -> text.
READ_ROWS = """rows => rows.map(tr => {
  const out = {worker: tr.dataset.worker};
  for (const td of tr.querySelectorAll('td[data-col]')) out[td.dataset.col] = td.textContent;
  return out;
})"""


def test_the_page_shows_what_the_api_says_in_headless_chromium(fed: Fed) -> None:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no chromium binary on PATH: `apt-get install -y chromium` (make setup)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip package playwright")

    page_reply = fed.get("/")
    assert page_reply.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page_reply.headers["content-security-policy"]

    dialogs: list[str] = []
    console_errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
        browser = pw.chromium.launch(executable_path=binary, headless=True, args=args)
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on(
                "console", lambda m: console_errors.append(m.text) if m.type == "error" else None
            )
            page.goto(fed.live.url + "/")
            page.wait_for_selector('body[data-loaded="true"]', timeout=20_000)
            api = fed.get("/v1/status").json()

            def field(name: str) -> str:
                return page.text_content(f'[data-field="{name}"]') or ""

            assert field("pool_id") == str(api["pool_id"])
            for name in ("policy_version", "trainer_step", "min_version", "in_flight_groups"):
                assert field(name) == str(api[name]), name
            assert field("workers_live") == str(api["workers_live"])
            assert field("workers_registered") == str(api["workers_registered"])

            shown = page.eval_on_selector_all("#workers tbody tr[data-worker]", READ_ROWS)
            assert [r["worker"] for r in shown] == [w["worker"] for w in api["workers"]]
            for row, w in zip(shown, api["workers"], strict=True):
                assert row["hardware"] == (w["hardware"] or "unknown")
                for col in ("leases", "submitted", "accepted", "units"):
                    assert row[col] == str(w[col]), (w["worker"], col)
                assert row["rejected"] == str(sum(w["rejected"].values()))
                by_reason = ", ".join(f"{k} {v}" for k, v in sorted(w["rejected"].items()))
                assert row["rejected_by_reason"] == by_reason
                state = "ejected" if w["ejected"] else "live" if w["live"] else "silent"
                assert row["state"] == state
                for col in ("submitted_per_min", "accepted_per_min"):
                    assert float(row[col]) == pytest.approx(w[col], abs=0.051), col
            assert shown[1]["hardware"] == HOSTILE  # the busy worker's markup, as text

            relays = page.eval_on_selector_all(
                "#relays tbody tr[data-relay]",
                "rows => rows.map(tr => [tr.dataset.relay,"
                " tr.querySelector('[data-col=health]').textContent])",
            )
            assert relays == [
                [r["url"], "healthy" if r["healthy"] else "down"] for r in api["relays"]
            ]

            steps = page.eval_on_selector_all(
                "#rewards tbody tr[data-step]", "rows => rows.map(tr => Number(tr.dataset.step))"
            )
            assert steps == [p["step"] for p in reversed(api["rewards"])]
            points = page.get_attribute("#spark polyline", "points") or ""
            assert len(points.split()) == len(api["rewards"])

            # Nothing a worker wrote ran or became an element.
            assert page.eval_on_selector_all("img", "els => els.length") == 0
            assert page.eval_on_selector_all("script", "els => els.length") == 1
            assert dialogs == []

            # The page keeps polling: a new trainer step shows up without a reload.
            progress.publish(fed.live.redis, step(6))
            page.wait_for_selector('#rewards tbody tr[data-step="6"]', timeout=15_000)
        finally:
            browser.close()
    assert not [e for e in console_errors if "Content Security Policy" in e], console_errors


def test_the_list_is_capped_and_the_api_rate_limited(fed: Fed) -> None:
    # A second silent, ejected worker: four workers, three listed (the cap of this pool).
    extra = Account.create().address.lower()
    fed.live.redis.hset(EJECTED, extra, json.dumps({"at": time.time()}))
    s = fed.get("/v1/status").json()
    assert len(s["workers"]) == 3 and s["workers_truncated"]
    assert [w["worker"] for w in s["workers"][:2]] == [fed.idle, fed.busy]

    refused = None
    for _ in range(60):  # burst 20 at 2/s: the allowance runs out well within this
        reply = fed.get("/v1/status")
        if reply.status_code == 429:
            refused = reply
            break
        assert reply.status_code == 200
    assert refused is not None, "the status API was never rate limited"
    assert refused.json()["detail"]["reason"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    # One allowance for every status route; the page itself costs none.
    # (Back to back: the allowance refills at 2/s, so a slow machine may let one through; a
    # route with an allowance of its own would answer all ten with its fresh burst of 20.)
    codes = [fed.get(f"/v1/status/workers/{fed.busy}").status_code for _ in range(10)]
    assert 429 in codes
    assert fed.get("/").status_code == 200
