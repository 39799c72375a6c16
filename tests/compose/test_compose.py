"""The whole network in containers: docker-compose.yml as users get it, on this machine.

`make test-compose` (marker `compose`, not in `make test`). The images are built first
(deploy/docker/images.py, what `make images` runs: a Docker engine started if none answers, bases
made by debootstrap, a wheelhouse instead of the index), then the project runs with the files a
user has (docker-compose.yml, and docker-compose.monitoring.yml to reach Prometheus) plus only
deploy/docker/compose.local.yml, which names the locally made base images. Four workers
(`--scale worker=4`), published ports on 127.0.0.1 only, networks and volumes of the test's own
project, removed at the end (`down -v`; images kept for the next run).

In order, on one running project:
1. every worker registers with a key of its own and has rollouts accepted; the chain holds
   attested units; the trainer publishes at least three versions;
2. Prometheus scrapes every service (each relay and each worker replica);
3. Grafana serves the three provisioned dashboards, one screenshotted in headless Chromium (only
   where the grafana/grafana image is present: no registry, Debian package or PyPI/npm release
   carries it here);
4. a worker, the validator, the orchestrator, the trainer and Redis, each killed (SIGKILL)
   during the run, come back by the compose restart policy, the run goes on, and the books
   balance: nothing trained twice, nothing lost, the chain's units equal to the validators'
   (books.account). Killed as a crash, not by `docker kill`: Docker takes that for a manual
   stop and no restart policy restarts it (ComposeProject.crash).

Artifacts (status, targets, books, screenshot, the services' logs) go to runs/compose-test/.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from compose_project import ComposeProject, docker, wait_for

from prime_swarm.deploy.local.books import account
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.localnet.ports import free_port

pytestmark = pytest.mark.compose

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "runs" / "compose-test"
FILES = ("docker-compose.yml", "docker-compose.monitoring.yml", "deploy/docker/compose.local.yml")
GRAFANA_IMAGE = "grafana/grafana:11.2.0"
WORKERS = 4
VERSIONS = 3
# Parts killed during the run (compose services); each once, in a seeded random order.
KILLED = ("worker", "validator", "orchestrator", "trainer", "redis")
KILL_SEED = 27
# Scrape jobs of deploy/prometheus/prometheus.yml and their targets with four workers.
TARGETS = {
    "orchestrator": 1, "origin": 1, "relay": 2, "trainer": 1, "validator": 1,
    "worker": WORKERS, "prometheus": 1,
}  # fmt: skip


class Swarm:
    """The running project and where the test reaches it."""

    def __init__(self, project: ComposeProject, ports: dict[str, int], secrets: Path) -> None:
        self.project, self.ports, self.secrets = project, ports, secrets
        self.orchestrator = f"http://127.0.0.1:{ports['orchestrator']}"
        self.prometheus = f"http://127.0.0.1:{ports['prometheus']}"
        self.grafana = f"http://127.0.0.1:{ports['grafana']}"
        self.kills: list[dict[str, object]] = []

    def status(self) -> dict:
        reply = httpx.get(f"{self.orchestrator}/v1/status", timeout=10)
        reply.raise_for_status()
        return reply.json()

    def version(self) -> int:
        return self.status()["policy_version"] or 0

    def wait_for_version(self, at_least: int, timeout_s: float) -> int:
        return wait_for(
            f"policy version {at_least}",
            lambda: v if (v := self.version()) >= at_least else None,
            timeout_s,
        )


def save(name: str, data: object) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / name).write_text(json.dumps(data, indent=1) + "\n")


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose missing: `make setup` installs Debian's docker-compose")
    if os.geteuid() != 0:
        pytest.skip("the compose test starts dockerd and chowns the secrets: run it as root")
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    # What `make images` runs: it starts dockerd when none answers and builds every image.
    subprocess.run([sys.executable, "deploy/docker/images.py"], cwd=REPO, check=True, timeout=3600)

    secrets = tmp_path_factory.mktemp("compose") / "secrets"
    subprocess.run(
        [Path(sys.executable).with_name("prime-swarm"), "compose-secrets", "--out", str(secrets)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    ports = {p: free_port() for p in ("orchestrator", "relay", "relay_1", "prometheus", "grafana")}
    env = {
        "SWARM_SECRETS_DIR": str(secrets),
        "SWARM_TAG": "local",
        # Never stop on its own: the test ends the run once it has seen what it needs.
        "SWARM_STEPS": "1000",
        "ORCHESTRATOR_PORT": f"127.0.0.1:{ports['orchestrator']}",
        "RELAY_PORT": f"127.0.0.1:{ports['relay']}",
        "RELAY_1_PORT": f"127.0.0.1:{ports['relay_1']}",
        "PROMETHEUS_PORT": str(ports["prometheus"]),
        "GRAFANA_PORT": str(ports["grafana"]),
    }
    if has_grafana():
        env["COMPOSE_PROFILES"] = "grafana"
    project = ComposeProject(f"swarmtest{uuid.uuid4().hex[:8]}", REPO, FILES, env)
    try:
        project.compose("up", "-d", "--no-build", "--scale", f"worker={WORKERS}", timeout=900)
        yield Swarm(project, ports, secrets)
    finally:
        (ARTIFACTS / "logs.txt").write_text(project.logs())
        project.compose("down", "-v", "--remove-orphans", timeout=300)


def has_grafana() -> bool:
    try:
        docker("image", "inspect", GRAFANA_IMAGE)
    except RuntimeError:
        return False
    return True


def test_workers_have_rollouts_attested_and_the_trainer_publishes(swarm: Swarm) -> None:
    swarm.wait_for_version(VERSIONS, timeout_s=900)

    def every_worker_accepted() -> dict | None:
        status = swarm.status()
        accepted = [w for w in status["workers"] if w["accepted"] > 0 and w["units"] > 0]
        return status if len(accepted) >= WORKERS else None

    status = wait_for("every worker's rollouts accepted", every_worker_accepted, 600, every_s=5)
    save("status.json", status)
    workers = {w["worker"] for w in status["workers"]}
    assert len(workers) == WORKERS == status["workers_registered"], "one key per replica"
    network = json.loads(swarm.project.read_file("orchestrator", "/data/chain/network.json"))
    units = wait_for(
        "units attested on chain",
        lambda: u if (u := attested_units(swarm, network)) > 0 else None,
        300,
        every_s=5,
    )
    assert units > 0
    assert status["policy_version"] >= VERSIONS


def test_prometheus_scrapes_every_service(swarm: Swarm) -> None:
    def all_up() -> list | None:
        reply = httpx.get(f"{swarm.prometheus}/api/v1/targets", timeout=10).json()
        active = reply["data"]["activeTargets"]
        up = Counter(t["labels"]["job"] for t in active if t["health"] == "up")
        return active if dict(up) == TARGETS else None

    active = wait_for("every target up", all_up, 180, every_s=5)
    save("prometheus_targets.json", active)
    assert sum(TARGETS.values()) == len(active)


def test_grafana_serves_the_provisioned_dashboards(swarm: Swarm) -> None:
    if not has_grafana():
        pytest.skip(
            f"{GRAFANA_IMAGE} is not on this machine and cannot be made here (no registry; no "
            "Debian, PyPI or npm package carries Grafana): compose.local.yml leaves it off"
        )
    password = (swarm.secrets / "grafana-admin.password").read_text().strip()
    auth = ("admin", password)
    found = wait_for(
        "grafana's dashboards",
        lambda: httpx.get(f"{swarm.grafana}/api/search", auth=auth, timeout=10).json() or None,
        180,
    )
    served = {d["uid"]: d for d in found if d.get("type") == "dash-db"}
    provisioned = {
        json.loads(path.read_text())["uid"]
        for path in (REPO / "deploy" / "grafana" / "dashboards").glob("*.json")
    }
    assert set(served) == provisioned and len(provisioned) == 3, sorted(served)
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip package playwright")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium"), headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{swarm.grafana}/login")
            page.fill('input[name="user"]', "admin")
            page.fill('input[name="password"]', password)
            page.click('button[type="submit"]')
            page.goto(f"{swarm.grafana}{served['prime-swarm-training']['url']}?kiosk")
            page.wait_for_selector(".react-grid-layout", timeout=60_000)
            page.wait_for_timeout(5_000)  # the panels' first queries
            page.screenshot(path=str(ARTIFACTS / "grafana.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "grafana.png").stat().st_size > 10_000


def test_killed_services_come_back_and_the_books_balance(swarm: Swarm) -> None:
    project = swarm.project
    order = list(KILLED)
    random.Random(KILL_SEED).shuffle(order)
    for service in order:
        container = project.containers(service)[0]
        _, restarts = project.running(container)
        before = wait_for("the status API", swarm.version, 180)
        project.crash(container)
        wait_for(
            f"{service} restarted",
            lambda c=container, n=restarts: (
                True if (s := project.running(c))[0] and s[1] > n else None
            ),
            180,
        )
        after = swarm.wait_for_version(before + 1, timeout_s=600)
        swarm.kills.append({"service": service, "version_at_kill": before, "went_on_to": after})
    swarm.wait_for_version(swarm.version() + 2, timeout_s=600)

    # A clean end: workers first, then the validator (it sends its queued attestations on
    # SIGTERM), then the trainer, so nothing moves while the books are read.
    for service in ("worker", "validator", "trainer"):
        project.compose("stop", service, timeout=180)
    network = json.loads(project.read_file("orchestrator", "/data/chain/network.json"))
    password = (swarm.secrets / "redis-auditor.password").read_text().strip()
    r = redis.Redis(
        host=project.ip(project.containers("redis")[0], "backend"),
        port=6379,
        username="auditor",
        password=password,
        socket_timeout=30,
        socket_connect_timeout=10,
    )
    try:
        books = account(r, attested_units(swarm, network))
    finally:
        r.close()
    save("books.json", {**books, "kills": swarm.kills, "kill_seed": KILL_SEED})
    rollouts = books["rollouts"]
    assert [k["service"] for k in swarm.kills] == order
    assert rollouts["trained"] > 0
    assert rollouts["unaccounted"] == 0, books["unaccounted_ids"]
    assert rollouts["trained_twice"] == 0, books["trained_twice_ids"]
    assert books["trained_not_submitted"] == 0
    assert books["onchain_units"] == books["validator_units"] > 0


def attested_units(swarm: Swarm, network: dict) -> int:
    """Units attested in the pool, read from anvil on the project's `public` network."""
    anvil = swarm.project.containers("anvil")[0]
    rpc = f"http://{swarm.project.ip(anvil, 'public')}:8545"
    ledger = LedgerClient(rpc, network["ledger"], account=None, timeout=30, request_timeout=10)
    return ledger.attested_units(int(network["pool_id"]))
