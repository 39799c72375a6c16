"""The status API's parts below the HTTP layer: per-minute throughput buckets, a worker's row
from raw Redis replies, reward points from the trainer's progress stream, the bounded hardware
field, and relay health checks (against small local HTTP servers), cached per interval."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from pydantic import ValidationError

from prime_swarm.protocol import streams
from prime_swarm.protocol import worker_stats as ws
from prime_swarm.protocol.messages import RegisterRequest, StepProgress
from prime_swarm.services.orchestrator.board import RelayWatch, probe, rewards, worker_row

T0 = 1_700_000_000.0
ADDRESS = "0x" + "ab" * 20


def test_the_window_is_the_full_minutes_and_the_current_part() -> None:
    now = ws.minute(T0) * 60 + 15.0  # 15 s into a minute
    assert ws.window(now) == list(range(ws.minute(now) - 5, ws.minute(now) + 1))
    assert ws.window_seconds(now) == 5 * 60 + 15
    at_edge = ws.minute(T0) * 60.0
    assert ws.window_seconds(at_edge) == 300.0


def test_per_minute_rate_counts_every_bucket_over_the_time_covered() -> None:
    now = ws.minute(T0) * 60 + 30.0  # window covers 330 s
    assert ws.per_minute([0] * 6, now) == 0.0
    # 11 events over 330 s: 2 a minute, wherever in the window they fell.
    assert ws.per_minute([1, 2, 0, 3, 4, 1], now) == pytest.approx(2.0)
    assert ws.per_minute([0, 0, 0, 0, 0, 11], now) == pytest.approx(2.0)
    # A steady 10/min worker reads 10/min at any point of the current minute.
    for into in (0.0, 1.0, 30.0, 59.9):
        t = ws.minute(T0) * 60 + into
        steady = [10] * 5 + [10 * into / 60]
        assert ws.per_minute(steady, t) == pytest.approx(10.0)


def test_a_worker_row_from_raw_replies() -> None:
    now = ws.minute(T0) * 60.0
    row = worker_row(
        ADDRESS,
        now=now,
        live_ttl_s=30,
        last_seen=now - 5,
        registered=True,
        ejected=False,
        info={
            b"hardware": b"NVIDIA H100 <b>",
            b"backend": b"vllm",
            b"device": b"cuda",
            b"leases": b"7",
            b"submitted": b"6",
        },
        verdicts={
            b"accepted": b"4",
            b"units": b"321",
            b"rejected:bad_proof": b"1",
            b"rejected:duplicate": b"1",
        },
        submits=[None, b"1", None, b"2", None, b"3"],
        accepts=[None, None, None, b"4", None, None],
    )
    assert row.worker == "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"  # EIP-55
    assert (row.hardware, row.backend, row.device) == ("NVIDIA H100 <b>", "vllm", "cuda")
    assert row.live and row.registered and not row.ejected
    assert (row.leases, row.submitted, row.accepted, row.units) == (7, 6, 4, 321)
    assert row.rejected == {"bad_proof": 1, "duplicate": 1}
    assert row.submitted_per_min == pytest.approx(6 * 60 / 300)
    assert row.accepted_per_min == pytest.approx(4 * 60 / 300)


def test_silence_ejection_and_garbage_counts() -> None:
    now = T0
    silent = worker_row(
        ADDRESS,
        now=now,
        live_ttl_s=30,
        last_seen=now - 31,
        registered=True,
        ejected=True,
        info={},
        verdicts={b"accepted": b"not a number"},
        submits=[],
        accepts=[],
    )
    # Registered again after an ejection: not ejected any more, just silent.
    assert not silent.live and not silent.ejected and silent.accepted == 0
    gone = worker_row(
        ADDRESS,
        now=now,
        live_ttl_s=30,
        last_seen=None,
        registered=False,
        ejected=True,
        info={},
        verdicts={},
        submits=[],
        accepts=[],
    )
    assert gone.ejected and not gone.live and gone.hardware == ""


def test_rewards_come_oldest_first_with_the_entry_time_and_skip_garbage() -> None:
    def step(n: int, reward: float) -> StepProgress:
        return StepProgress(
            step=n,
            version=n,
            mean_reward=reward,
            groups=1,
            policy_lag_mean=0.0,
            policy_lag_max=0,
            stale_dropped=0,
            accepted_total=0,
            rejected_total=0,
            loss=0.0,
            clip_frac=0.0,
            seconds=1.0,
            wall=1.0,
        )

    newest_first = [
        (b"1700000002000-0", streams.encode(step(2, 0.5))),
        (b"1700000001500-0", {b"data": b"{not json"}),
        (b"1700000001000-0", streams.encode(step(1, 0.25))),
    ]
    points = rewards(newest_first)
    assert [(p.step, p.mean_reward, p.at) for p in points] == [
        (1, 0.25, 1_700_000_001.0),
        (2, 0.5, 1_700_000_002.0),
    ]


def test_hardware_is_bounded_text() -> None:
    ok = RegisterRequest(worker=ADDRESS, pool_id=1, hardware="AMD EPYC 9654 <script>")
    assert ok.hardware == "AMD EPYC 9654 <script>"  # markup is the page's job to escape
    assert RegisterRequest(worker=ADDRESS, pool_id=1).hardware == ""
    for bad in ("x" * 129, "GPU\x1b[2J", "two\nlines", "nul\x00"):
        with pytest.raises(ValidationError):
            RegisterRequest(worker=ADDRESS, pool_id=1, hardware=bad)


class Relayish:
    """A local HTTP server answering /healthz with a fixed status and body, counting hits."""

    def __init__(self, status: int, body: bytes, delay_s: float = 0.0) -> None:
        outer = self
        self.hits = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                outer.hits += 1
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda *_: None  # a client that gave up: expected here
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_relay_probes_judge_the_answer_and_bound_the_wait() -> None:
    good = Relayish(200, json.dumps({"status": "ok", "latest": 7}).encode())
    sick = Relayish(503, b'{"status": "ok"}')
    liar = Relayish(200, b"<html>ok</html>")
    slow = Relayish(200, b'{"status": "ok"}', delay_s=2.0)
    relays = [good, sick, liar, slow]

    async def check() -> list:
        async with httpx.AsyncClient(timeout=5) as client:
            return await asyncio.gather(*(probe(client, r.url, 0.5) for r in relays))

    try:
        started = time.monotonic()
        g, s, li, sl = asyncio.run(check())
        assert time.monotonic() - started < 1.9  # the slow relay's deadline, not its delay
    finally:
        for r in relays:
            r.close()
    assert g.healthy and g.status_code == 200 and g.latest_version == 7 and g.error == ""
    assert not s.healthy and s.status_code == 503 and "503" in s.error
    assert not li.healthy and li.status_code == 200 and li.latest_version is None
    assert not sl.healthy and sl.status_code is None and sl.error.startswith("TimeoutError")
    dead = asyncio.run(RelayWatch(["http://127.0.0.1:1"], 5, 0.5).health())
    assert [(d.healthy, d.status_code) for d in dead] == [(False, None)]


def test_relay_health_is_checked_once_per_interval_whoever_asks() -> None:
    relay = Relayish(200, b'{"status": "ok", "latest": null}')

    async def scenario() -> tuple[int, int, int]:
        watch = RelayWatch([relay.url], interval_s=1.0, timeout_s=1)
        for _ in range(20):  # a crowd of page loads: one check
            assert (await watch.health())[0].healthy
        first = relay.hits
        await asyncio.sleep(1.05)
        stale = await watch.health()  # served at once while a fresh check runs
        assert stale[0].healthy
        await asyncio.sleep(0.4)
        second = relay.hits
        for _ in range(20):
            await watch.health()
        watch.close()
        return first, second, relay.hits

    try:
        assert asyncio.run(scenario()) == (1, 2, 2)
    finally:
        relay.close()
