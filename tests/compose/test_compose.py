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
   (deploy/local/books.py). Killed as a crash, not by `docker kill`: Docker takes that for a manual
   stop and no restart policy restarts it (ComposeProject.crash).

All of it runs twice: with docker-compose.yml as it is, and with the high-availability override
on (docker-compose.ha.yml, and deploy/docker/compose.ha.local.yml for its local images): Redis
a primary, a replica and three Sentinels, every service finding the primary through them, and
three orchestrator replicas behind HAProxy, whose address is on chain and in front of the test.
There the kills are the ones HA is for: the Redis primary's machine lost (it hangs until the
Sentinels have promoted the replica, then is SIGKILLed and restarted by its policy, and comes
back as the new primary's replica) and one orchestrator replica crashed; the books must balance
the same way, read from whichever node the Sentinels name the primary.

Artifacts (status, targets, books, screenshot, the services' logs) go to runs/compose-test/, and
the HA run's (with ha.json: the failover's timings) to runs/compose-test-ha/.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from compose_project import ComposeProject, docker, wait_for

from prime_swarm.deploy.local.books import Books
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.localnet.ports import free_port

pytestmark = pytest.mark.compose

REPO = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yml", "docker-compose.monitoring.yml", "deploy/docker/compose.local.yml")
# The HA override after the base file, its local images after compose.local.yml's.
HA_FILES = (
    "docker-compose.yml",
    "docker-compose.ha.yml",
    "docker-compose.monitoring.yml",
    "deploy/docker/compose.local.yml",
    "deploy/docker/compose.ha.local.yml",
)
ARTIFACTS = {"base": REPO / "runs" / "compose-test", "ha": REPO / "runs" / "compose-test-ha"}
GRAFANA_IMAGE = "grafana/grafana:11.2.0"
WORKERS = 4
VERSIONS = 3
# Parts killed during the run (compose services); each once, in a seeded random order.
KILLED = ("worker", "validator", "orchestrator", "trainer", "redis")
KILL_SEED = 27
# With the HA override: the Redis primary (whichever node the Sentinels name) and one of the
# orchestrator replicas, each once, in a seeded random order.
HA_KILLED = ("redis-primary", "orchestrator-replica")
ORCHESTRATORS = ("orchestrator", "orchestrator-2", "orchestrator-3")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
# libs/localnet/redis_ha.py's, which docker-compose.ha.yml gives its Sentinels.
SENTINEL_SERVICE, SENTINEL_QUORUM = "prime", 2
# Scrape jobs of deploy/prometheus/prometheus.yml and their targets with four workers.
TARGETS = {
    "orchestrator": 1, "origin": 1, "relay": 2, "trainer": 1, "validator": 1,
    "worker": WORKERS, "prometheus": 1,
}  # fmt: skip


class Swarm:
    """The running project and where the test reaches it."""

    def __init__(
        self, project: ComposeProject, ports: dict[str, int], secrets: Path, variant: str
    ) -> None:
        self.project, self.ports, self.secrets, self.variant = project, ports, secrets, variant
        self.ha = variant == "ha"
        self.artifacts = ARTIFACTS[variant]
        # With HA, the pool's address: the balancer in front of the replicas.
        front = "orchestrator_lb" if self.ha else "orchestrator"
        self.orchestrator = f"http://127.0.0.1:{ports[front]}"
        self.prometheus = f"http://127.0.0.1:{ports['prometheus']}"
        self.grafana = f"http://127.0.0.1:{ports['grafana']}"
        self.kills: list[dict[str, object]] = []
        # Read as the run goes: the streams are trimmed ten minutes behind their consumers.
        self.books, self._books_read_at = Books(), 0.0

    def save(self, name: str, data: object) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        (self.artifacts / name).write_text(json.dumps(data, indent=1) + "\n")

    def status(self) -> dict:
        reply = httpx.get(f"{self.orchestrator}/v1/status", timeout=10)
        reply.raise_for_status()
        return reply.json()

    def version(self) -> int:
        return self.status()["policy_version"] or 0

    def wait_for_version(self, at_least: int, timeout_s: float) -> int:
        def reached() -> int | None:
            self.read_books(every_s=30)
            return v if (v := self.version()) >= at_least else None

        return wait_for(f"policy version {at_least}", reached, timeout_s)

    def auditor(self) -> redis.Redis:
        """The primary as the read-only `auditor` user (deploy/redis_acl.py)."""
        password = (self.secrets / "redis-auditor.password").read_text().strip()
        return redis.Redis(
            host=self.redis_primary_ip(),
            port=6379,
            username="auditor",
            password=password,
            socket_timeout=30,
            socket_connect_timeout=10,
        )

    def read_books(self, every_s: float = 0) -> None:
        """Catch the books up; skipped while Redis is down or failing over (the next read
        re-reads what it missed)."""
        if time.monotonic() - self._books_read_at < every_s:
            return
        try:
            r = self.auditor()
            try:
                self.books.read(r)
                self._books_read_at = time.monotonic()
            finally:
                r.close()
        except Exception:  # noqa: BLE001 - a container restarting, no primary agreed on yet;
            pass  # what matters is the closing read, which raises

    # ---------------------------------------------------------------- HA: who is the primary
    def _sentinels(self) -> list[redis.Redis]:
        return [
            redis.Redis(
                host=self.project.ip(self.project.containers(name)[0], "backend"),
                port=26379,
                socket_timeout=2,
                socket_connect_timeout=1,
                decode_responses=True,
            )
            for name in SENTINELS
        ]

    def redis_primary(self) -> str | None:
        """The service the Sentinels name the primary (by its DNS name: they announce names), if
        a quorum of them agrees; as every service finds it."""
        votes: Counter[str] = Counter()
        for sentinel in self._sentinels():
            try:
                host, _ = sentinel.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                votes[host] += 1
            except (redis.RedisError, TypeError):
                continue
            finally:
                sentinel.close()
        best = votes.most_common(1)
        return best[0][0] if best and best[0][1] >= SENTINEL_QUORUM else None

    def replica_in_sync(self, node: str) -> bool | None:
        """Whether a quorum of the Sentinels sees `node` as a replica whose link to the primary
        is up; None if not (yet)."""
        agree = 0
        for sentinel in self._sentinels():
            try:
                replicas = sentinel.sentinel_slaves(SENTINEL_SERVICE)
            except redis.RedisError:
                continue
            finally:
                sentinel.close()
            agree += any(
                r["ip"] == node
                and r.get("master-link-status") == "ok"
                and not {"s_down", "o_down", "disconnected"} & set(r["flags"])
                for r in replicas
            )
        return True if agree >= SENTINEL_QUORUM else None

    def redis_primary_ip(self) -> str:
        """The backend address of the node the Sentinels name the primary: the books read it."""
        primary = self.redis_primary() if self.ha else "redis"
        assert primary is not None, "the Sentinels agree on no primary"
        return self.project.ip(self.project.containers(primary)[0], "backend")


@pytest.fixture(scope="module", params=["base", "ha"])
def swarm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Swarm]:
    """One project per variant; pytest runs every test on one before it starts the other."""
    variant: str = request.param
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose missing: `make setup` installs Debian's docker-compose")
    if os.geteuid() != 0:
        pytest.skip("the compose test starts dockerd and chowns the secrets: run it as root")
    artifacts = ARTIFACTS[variant]
    if artifacts.exists():
        shutil.rmtree(artifacts)
    artifacts.mkdir(parents=True)
    # What `make images` runs: it starts dockerd when none answers and builds every image.
    subprocess.run([sys.executable, "deploy/docker/images.py"], cwd=REPO, check=True, timeout=3600)

    secrets = tmp_path_factory.mktemp("compose") / "secrets"
    subprocess.run(
        [Path(sys.executable).with_name("prime-swarm"), "compose-secrets", "--out", str(secrets)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    ports = {
        p: free_port()
        for p in ("orchestrator", "orchestrator_lb", "relay", "relay_1", "prometheus", "grafana")
    }
    env = {
        "SWARM_SECRETS_DIR": str(secrets),
        "SWARM_TAG": "local",
        # Never stop on its own: the test ends the run once it has seen what it needs.
        "SWARM_STEPS": "1000",
        "ORCHESTRATOR_PORT": f"127.0.0.1:{ports['orchestrator']}",
        "ORCHESTRATOR_LB_PORT": f"127.0.0.1:{ports['orchestrator_lb']}",
        "RELAY_PORT": f"127.0.0.1:{ports['relay']}",
        "RELAY_1_PORT": f"127.0.0.1:{ports['relay_1']}",
        "PROMETHEUS_PORT": str(ports["prometheus"]),
        "GRAFANA_PORT": str(ports["grafana"]),
    }
    if has_grafana():
        env["COMPOSE_PROFILES"] = "grafana"
    files = HA_FILES if variant == "ha" else FILES
    project = ComposeProject(f"swarmtest{uuid.uuid4().hex[:8]}", REPO, files, env)
    try:
        project.compose("up", "-d", "--no-build", "--scale", f"worker={WORKERS}", timeout=900)
        yield Swarm(project, ports, secrets, variant)
    finally:
        (artifacts / "logs.txt").write_text(project.logs())
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
    swarm.save("status.json", status)
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
    swarm.save("prometheus_targets.json", active)
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
            page.screenshot(path=str(swarm.artifacts / "grafana.png"), full_page=True)
        finally:
            browser.close()
    assert (swarm.artifacts / "grafana.png").stat().st_size > 10_000


def test_killed_services_come_back_and_the_books_balance(swarm: Swarm) -> None:
    project = swarm.project
    order = list(HA_KILLED if swarm.ha else KILLED)
    random.Random(KILL_SEED).shuffle(order)
    for part in order:
        if part == "redis-primary":
            lose_the_redis_primary(swarm)
        elif part == "orchestrator-replica":
            crash(swarm, random.Random(KILL_SEED).choice(ORCHESTRATORS), part)
        else:
            crash(swarm, part, part)
    swarm.wait_for_version(swarm.version() + 2, timeout_s=600)
    if swarm.ha:
        # Every replica back behind the balancer, and the old primary a replica in sync.
        for name in ORCHESTRATORS:
            container = project.containers(name)[0]
            wait_for(f"{name} healthy", lambda c=container: project.healthy(c) or None, 120)

    # A clean end: workers first, then the validator (it sends its queued attestations on
    # SIGTERM), then the trainer, so nothing moves while the books are read.
    for service in ("worker", "validator", "trainer"):
        project.compose("stop", service, timeout=180)
    network = json.loads(project.read_file("orchestrator", "/data/chain/network.json"))
    r = swarm.auditor()
    try:
        books = swarm.books.account(r, attested_units(swarm, network))
    finally:
        r.close()
    swarm.save("books.json", {**books, "kills": swarm.kills, "kill_seed": KILL_SEED})
    rollouts = books["rollouts"]
    assert [k["part"] for k in swarm.kills] == order
    assert rollouts["trained"] > 0
    assert rollouts["unaccounted"] == 0, books["unaccounted_ids"]
    assert rollouts["trained_twice"] == 0, books["trained_twice_ids"]
    assert books["trained_not_submitted"] == 0
    assert books["onchain_units"] == books["validator_units"] > 0
    if swarm.ha:
        # The workers reached the pool through the balancer: its address is the one on chain.
        assert network["orchestrator_url"] == "http://orchestrator-lb:8000"


def crash(swarm: Swarm, service: str, part: str) -> None:
    """SIGKILL the service's (first) container; the compose restart policy brings it back, and
    training goes on (a new version, read through the pool's front door). `part`: what it
    stands for in the kill list (KILLED, HA_KILLED)."""
    project = swarm.project
    container = project.containers(service)[0]
    _, restarts = project.running(container)
    before = wait_for("the status API", swarm.version, 180)
    project.crash(container)
    wait_for(
        f"{service} restarted",
        lambda c=container, n=restarts: True if (s := project.running(c))[0] and s[1] > n else None,
        180,
    )
    after = swarm.wait_for_version(before + 1, timeout_s=600)
    swarm.kills.append(
        {"part": part, "service": service, "version_at_kill": before, "went_on_to": after}
    )


def lose_the_redis_primary(swarm: Swarm) -> None:
    """The machine of the node the Sentinels name the primary hangs until they have promoted
    the other node, then is rebooted (SIGKILL, the restart policy): it comes back as the new
    primary's replica. Training goes on through the promoted one."""
    project = swarm.project
    old = swarm.redis_primary()
    assert old in ("redis", "redis-replica"), old
    other = "redis-replica" if old == "redis" else "redis"
    wait_for(f"{other}, the replica of {old}, in sync", lambda: swarm.replica_in_sync(other), 120)
    container = project.containers(old)[0]
    _, restarts = project.running(container)
    before = wait_for("the status API", swarm.version, 180)
    lost = time.monotonic()
    new = project.hang_then_crash(
        container,
        lambda: p if (p := swarm.redis_primary()) not in (None, old) else None,
        timeout_s=60,
    )
    promoted_s = time.monotonic() - lost
    wait_for(
        f"{old} restarted",
        lambda: True if (s := project.running(container))[0] and s[1] > restarts else None,
        180,
    )
    after = swarm.wait_for_version(before + 1, timeout_s=600)
    went_on_s = time.monotonic() - lost
    wait_for(f"{old} a replica of {new}, in sync", lambda: swarm.replica_in_sync(old), 180)
    rejoined_s = time.monotonic() - lost
    timings = {
        "lost": old,
        "promoted": new,
        "promoted_after_s": round(promoted_s, 1),
        "next_version_after_s": round(went_on_s, 1),
        "lost_node_in_sync_after_s": round(rejoined_s, 1),
    }
    swarm.save("ha.json", timings)
    kill = {"part": "redis-primary", "service": old, "version_at_kill": before, "went_on_to": after}
    swarm.kills.append({**kill, **timings})


def attested_units(swarm: Swarm, network: dict) -> int:
    """Units attested in the pool, read from anvil on the project's `public` network."""
    anvil = swarm.project.containers("anvil")[0]
    rpc = f"http://{swarm.project.ip(anvil, 'public')}:8545"
    ledger = LedgerClient(rpc, network["ledger"], account=None, timeout=30, request_timeout=10)
    return ledger.attested_units(int(network["pool_id"]))
