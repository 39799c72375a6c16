"""schemathesis against the orchestrator, the origin and a relay, each a real process over HTTP.

The smaller pass of `make fuzz` (bench/fuzz, 1000 cases a service): at least 100 generated
cases per service, signed as the harness (tests/support/fuzz_harness.py) signs them (most by a
staked, registered worker, the rest unsigned or wrongly signed; origin uploads carry
trainer-signed manifests), with a fixed seed so a failure reproduces. No case may get a 5xx,
the process must survive and answer /healthz, and no wrongly signed request may get a 2xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzz_harness import (
    ServiceReport,
    ShardcastStack,
    Target,
    fuzz_service,
    orchestrator_stack,
    shardcast_stack,
)

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer

CASES = 100
SEED = 1


@pytest.fixture(scope="module")
def orchestrator(
    anvil: Anvil, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    logs: Path = tmp_path_factory.mktemp("fuzz-orchestrator")
    with orchestrator_stack(anvil.rpc_url, anvil.dev_accounts(1)[0], redis_server.url, logs) as s:
        yield s.target


@pytest.fixture(scope="module")
def shardcast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardcastStack]:
    with shardcast_stack(tmp_path_factory.mktemp("fuzz-shardcast")) as stack:
        yield stack


def _assert_clean(report: ServiceReport) -> None:
    detail = json.dumps(report.as_json(), indent=1)[:6000]
    assert report.cases >= CASES, detail
    assert report.server_errors == 0, detail
    assert report.crashes == 0 and report.alive_after and report.healthz_after == 200, detail
    assert report.auth_bypass == 0, detail
    assert report.transport_errors == 0, detail


def test_orchestrator_survives_signed_fuzzing(orchestrator: Target) -> None:
    report = fuzz_service(orchestrator, CASES, SEED)
    _assert_clean(report)
    # The signing hook works: signed cases get past auth to the routes (not all 401).
    assert report.statuses["200"] >= 5, report.as_json()["statuses"]
    assert report.modes["member"] >= CASES // 4


def test_relay_survives_fuzzing(shardcast: ShardcastStack) -> None:
    # Before the origin's run: its fuzzed uploads may evict the version the relay serves.
    report = fuzz_service(shardcast.relay, CASES, SEED)
    _assert_clean(report)
    assert report.statuses["200"] + report.statuses["206"] >= 5  # real shards were served


def test_origin_survives_fuzzing(shardcast: ShardcastStack) -> None:
    report = fuzz_service(shardcast.origin, CASES, SEED)
    _assert_clean(report)
    # Trainer-signed manifests were accepted, so upload cases reached the store.
    assert report.statuses["200"] >= 5
