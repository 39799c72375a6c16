"""The compose deployment (docker-compose.yml, deploy/docker, deploy/prometheus, deploy/grafana)
agrees with the code: every DESIGN service is there, each image carries its own extra, and every
PRIME_* variable it sets is a real setting of the service that reads it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from script_files import load_script

from prime_swarm.deploy import compose_secrets
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.relay.settings import RelaySettings
from prime_swarm.services.trainer.settings import TrainerSettings
from prime_swarm.services.validator.settings import ValidatorSettings
from prime_swarm.services.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DEPLOYER = ROOT / "deploy" / "docker" / "deployer.py"

# Settings class of each PRIME_* prefix.
SETTINGS = {
    "PRIME_ORCH_": OrchestratorSettings,
    "PRIME_TRAINER_": TrainerSettings,
    "PRIME_VALIDATOR_": ValidatorSettings,
    "PRIME_RELAY_": RelaySettings,
    "PRIME_WORKER_": WorkerSettings,
}
RECIPE_PREFIX = "PRIME_RECIPE_"
# PRIME_* names read by something other than a settings class.
OTHER_PRIME_VARS = {"PRIME_ANVIL_BIN", "PRIME_CHAIN_PRIVATE_KEY"}

# Compose service -> the extra its image installs (None: a third-party image).
ROLE_EXTRA = {
    "redis": None,
    "anvil": "chain",
    "deployer": "chain",
    "model-init": "trainer",
    "origin": "relay",
    "relay-0": "relay",
    "relay-1": "relay",
    "orchestrator": "orchestrator",
    "validator": "validator",
    "trainer": "trainer",
    "prometheus": None,
    "grafana": None,
}
# Compose service -> the settings prefix of the service it runs.
ROLE_PREFIX = {
    "origin": "PRIME_RELAY_",
    "relay-0": "PRIME_RELAY_",
    "relay-1": "PRIME_RELAY_",
    "orchestrator": "PRIME_ORCH_",
    "validator": "PRIME_VALIDATOR_",
    "trainer": "PRIME_TRAINER_",
}
TORCH_EXTRAS = {"trainer", "validator", "worker"}
RELAYS = ("relay-0", "relay-1")
PUBLISHED = {"orchestrator", *RELAYS}
WORKERS = 3  # replicas of the `worker` service
MONITORING_FILE = ROOT / "docker-compose.monitoring.yml"
HA_FILE = ROOT / "docker-compose.ha.yml"
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.sh"
# Compose service -> the Redis ACL role it connects as (deploy/redis_acl.py); no other service
# may reach Redis.
REDIS_ROLE = {"orchestrator": "orchestrator", "validator": "validator", "trainer": "trainer"}
# Compose service -> the secret holding its Ethereum key; no other service mounts any key.
KEY_SECRET = {"trainer": {"trainer_key"}, "validator": {"validator_key"}}
# The worker key pool: every replica mounts all of it and claims one (deploy/docker/claim_key.py).
WORKER_KEY_SECRETS = {f"worker_{i}_key" for i in range(compose_secrets.WORKER_KEYS)}
BACKEND_ONLY = {"redis", "grafana", "validator", "trainer", "origin", "deployer"}
PUBLIC = {"orchestrator", *RELAYS}
# Internal, Prometheus and the workers only: how it scrapes each replica without joining `public`.
WORKER_METRICS_NET = "worker-metrics"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def deployer() -> ModuleType:
    return load_script(DEPLOYER, "compose_deployer")  # stdlib-only at import time


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def worker_services(services: dict[str, dict]) -> list[str]:
    return sorted(n for n in services if n == "worker" or n.startswith("worker-"))


def role_of(name: str) -> str:
    return "worker" if name.startswith("worker") else name


def prefix_of(name: str) -> str | None:
    return "PRIME_WORKER_" if role_of(name) == "worker" else ROLE_PREFIX.get(name)


def settings_for(var: str) -> tuple[str, type] | None:
    for prefix, cls in SETTINGS.items():
        if var.startswith(prefix):
            return prefix, cls
    return None


def extras_closure(extra: str, table: dict[str, list[str]]) -> tuple[set[str], list[str]]:
    """The extras `extra` pulls in (itself included) and all their requirement strings."""
    seen, reqs, todo = set(), [], [extra]
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in table[e]:
            m = re.fullmatch(r"prime-swarm\[([^\]]+)\]", req.strip())
            if m:
                todo.extend(x.strip() for x in m.group(1).split(","))
            else:
                reqs.append(req)
    return seen, reqs


# ------------------------------------------------------------------------------------ services


def test_every_design_service_is_present(services: dict[str, dict]) -> None:
    missing = sorted(set(ROLE_EXTRA) - set(services))
    assert not missing, f"docker-compose.yml lacks {missing}"
    workers = worker_services(services)
    replicas = sum(int(((services[w].get("deploy") or {}).get("replicas")) or 1) for w in workers)
    assert replicas == WORKERS, f"expected {WORKERS} workers, found {workers} ({replicas})"


def test_each_image_installs_its_roles_extra(services: dict[str, dict]) -> None:
    by_image: dict[str, str] = {}
    for name, svc in services.items():
        expected = "worker" if role_of(name) == "worker" else ROLE_EXTRA.get(name)
        build = svc.get("build")
        if expected is None:
            assert build is None, f"{name} is a stock image and should not be built"
            continue
        assert isinstance(build, dict), f"{name} must be built from deploy/docker/Dockerfile"
        assert build["dockerfile"] == "deploy/docker/Dockerfile"
        assert build.get("context", ".") == "."
        extra = build["args"]["EXTRA"]
        assert extra == expected, f"{name} image has EXTRA={extra}, expected {expected}"
        image = svc["image"]
        assert by_image.setdefault(image, extra) == extra, f"{image} is built with two extras"


def test_the_torch_free_images_start_their_services_without_torch() -> None:
    """What the relay, orchestrator and chain images run imports with torch absent. (The first
    compose run found the orchestrator image dead at start: the acceptance limits it reads
    imported TOPLOC's proof code, and with it torch.)"""
    modules = [
        "prime_swarm.services.relay.cli",
        "prime_swarm.services.relay.app",
        "prime_swarm.services.orchestrator.cli",
        "prime_swarm.services.orchestrator.app",
        "prime_swarm.services.chain.cli",
    ]
    code = "import sys; sys.modules['torch'] = None\n" + "".join(f"import {m}\n" for m in modules)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_relay_orchestrator_and_chain_extras_never_pull_torch() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("relay", "orchestrator", "chain"):
        _, reqs = extras_closure(extra, table)
        assert not [r for r in reqs if r.startswith("torch")], f"{extra} pulls torch"
    for extra in TORCH_EXTRAS:
        _, reqs = extras_closure(extra, table)
        assert "torch==2.13.0" in reqs, f"{extra} should need the pinned torch"


def test_dockerfile_builds_per_extra_with_pinned_cpu_torch() -> None:
    text = DOCKERFILE.read_text()
    assert "ARG EXTRA" in text
    assert re.search(r"^FROM \$\{PYTHON_IMAGE\}", text, re.M)
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert "ARG TORCH_VERSION=2.13.0" in text
    assert "https://download.pytorch.org/whl/cpu" in text
    # torch is installed for exactly the extras that need it, before the package itself.
    case = re.search(r"^\s*([a-z|]+)\) pip install --index-url", text, re.M)
    assert case and set(case.group(1).split("|")) == TORCH_EXTRAS
    assert text.index("torch==${TORCH_VERSION}") < text.index('pip install ".[${EXTRA}]"')
    # The anvil package is the one `make` installs locally.
    anvil = json.loads((ROOT / ".tools" / "package.json").read_text())["dependencies"]
    assert f"ARG ANVIL_VERSION={anvil['@foundry-rs/anvil-linux-amd64']}" in text
    # The final stage runs as the unprivileged user and holds no build tools.
    final = text[text.rindex("\nFROM ") :]
    assert re.search(r"^USER prime$", final, re.M)
    for tool in ("apt-get", "npm", "gcc", "pip install"):
        assert tool not in final, f"final stage uses {tool}"


# ------------------------------------------------------------------------------------ settings


def test_every_prime_variable_is_a_setting_of_its_service(
    services: dict[str, dict], deployer: ModuleType
) -> None:
    problems = []
    for name, svc in services.items():
        for var in env_of(svc):
            if not var.startswith("PRIME_") or var in OTHER_PRIME_VARS:
                continue
            if var.startswith(RECIPE_PREFIX):
                owner = SETTINGS.get(prefix_of(name) or "")
                if var[len(RECIPE_PREFIX) :].lower() not in Recipe.model_fields:
                    problems.append(f"{name}: {var} is not a field of Recipe")
                if owner is None or "recipe" not in owner.model_fields:
                    problems.append(f"{name}: {var} set on a service that takes no recipe")
                continue
            found = settings_for(var)
            if found is None:
                problems.append(f"{name}: {var} has no settings class")
                continue
            prefix, cls = found
            if prefix_of(name) != prefix:
                problems.append(f"{name}: {var} belongs to another service ({cls.__name__})")
            if var[len(prefix) :].lower() not in cls.model_fields:
                problems.append(f"{name}: {var} is not a field of {cls.__name__}")
    for file, variables in deployer.ENV_FILES.items():
        for var in variables:
            found = settings_for(var)
            if found is None or var[len(found[0]) :].lower() not in found[1].model_fields:
                problems.append(f"deployer {file}: {var} is not a setting")
    assert not problems, "\n".join(problems)


def test_the_recipe_is_set_once_for_every_service_that_takes_it(
    services: dict[str, dict],
) -> None:
    """Orchestrator, validator and trainer must agree on group size, temperature, async level:
    they read the same PRIME_RECIPE_* values, from one anchor."""
    recipes = {}
    for name, svc in services.items():
        owner = SETTINGS.get(prefix_of(name) or "")
        if owner is not None and "recipe" in owner.model_fields:
            recipes[name] = {k: v for k, v in env_of(svc).items() if k.startswith(RECIPE_PREFIX)}
    assert {"orchestrator", "validator", "trainer"} <= set(recipes)
    first = next(iter(recipes.values()))
    assert first, "no recipe variables set"
    assert all(r == first for r in recipes.values()), recipes
    Recipe(**{k[len(RECIPE_PREFIX) :].lower(): v for k, v in first.items()})


def test_required_settings_are_provided(services: dict[str, dict], deployer: ModuleType) -> None:
    problems = []
    for name, svc in services.items():
        prefix = prefix_of(name)
        if prefix is None:
            continue
        cls = SETTINGS[prefix]
        env = env_of(svc)
        provided = {v[len(prefix) :].lower() for v in env if v.startswith(prefix)}
        env_file = env.get("SWARM_ENV_FILE")
        if env_file:
            file_vars = deployer.ENV_FILES[Path(env_file).name]
            provided |= {v[len(prefix) :].lower() for v in file_vars if v.startswith(prefix)}
            assert env_file.startswith("/data/chain/"), f"{name}: env file outside the volume"
        if cls is RelaySettings:
            provided.add("mode")  # the `prime-relay origin|relay` subcommand
        required = {f for f, info in cls.model_fields.items() if info.is_required()}
        if not required <= provided:
            problems.append(f"{name}: {cls.__name__} needs {sorted(required - provided)}")
    assert not problems, "\n".join(problems)


PLACEHOLDERS = {"ledger": "0x" + "5f" * 20, "pool_id": "1", "trainer": "0x" + "34" * 20}


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


@pytest.mark.parametrize("name", ["origin", *RELAYS, "orchestrator", "validator", "trainer",
                                  "worker"])  # fmt: skip
def test_settings_load_from_the_compose_environment(
    name: str, services: dict[str, dict], deployer: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's settings class accepts exactly what its container will see."""
    svc = services[name] if name in services else services[worker_services(services)[0]]
    prefix = prefix_of(name)
    assert prefix is not None
    env = env_of(svc)
    for var in list(os.environ):
        if var.startswith(prefix):
            monkeypatch.delenv(var)
    if "SWARM_ENV_FILE" in env:
        for var, field in deployer.ENV_FILES[Path(env["SWARM_ENV_FILE"]).name].items():
            monkeypatch.setenv(var, PLACEHOLDERS[field])
    for var, value in env.items():
        if var.startswith(prefix):
            monkeypatch.setenv(var, interpolate(value))
    kwargs = {"mode": svc["command"][1]} if prefix == "PRIME_RELAY_" else {}
    settings = SETTINGS[prefix](**kwargs)
    if prefix == "PRIME_RELAY_" and kwargs["mode"] == "relay":
        assert settings.parents == ["http://origin:8700"]
    if prefix == "PRIME_WORKER_":
        # No terminal in a container: `join` must stake without asking, or it exits at once.
        assert settings.yes is True


def test_services_bind_all_interfaces_and_expose_health(services: dict[str, dict]) -> None:
    for name in ("origin", *RELAYS):
        env = env_of(services[name])
        assert env["PRIME_RELAY_HOST"] == "0.0.0.0"
        assert services[name]["command"][:2] == ["prime-relay", "origin" if name == "origin"
                                                 else "relay"]  # fmt: skip
    assert env_of(services["orchestrator"])["PRIME_ORCH_HOST"] == "0.0.0.0"
    for name, prefix in (("trainer", "PRIME_TRAINER_"), ("validator", "PRIME_VALIDATOR_")):
        env = env_of(services[name])
        assert env[f"{prefix}METRICS_HOST"] == "0.0.0.0"
        assert int(env[f"{prefix}METRICS_PORT"]) > 0
    assert "0.0.0.0" in services["anvil"]["command"]


def test_both_relays_pull_from_the_origin_and_serve_everyone(services: dict[str, dict]) -> None:
    """Each relay pulls from the origin into a volume of its own; the validator downloads from
    both, and so do the workers, which get the list from the orchestrator (WorkerSettings takes
    no relays: the orchestrator hands them out with each policy version)."""
    urls = [f"http://{r}:{env_of(services[r])['PRIME_RELAY_PORT']}" for r in RELAYS]
    for name, prefix in (("orchestrator", "PRIME_ORCH_"), ("validator", "PRIME_VALIDATOR_")):
        assert json.loads(env_of(services[name])[f"{prefix}RELAYS"]) == urls, name
    assert "relays" not in WorkerSettings.model_fields
    data_volumes = set()
    for relay in RELAYS:
        env = env_of(services[relay])
        assert json.loads(env["PRIME_RELAY_PARENTS"]) == ["http://origin:8700"]
        assert services[relay]["depends_on"]["origin"]["condition"] == "service_healthy"
        (data,) = [v for v in services[relay]["volumes"] if v.endswith(env["PRIME_RELAY_DATA_DIR"])]
        data_volumes.add(data)
    assert len(data_volumes) == len(RELAYS), "relays share a data volume"
    for name in ("orchestrator", "validator", *worker_services(services)):
        for relay in RELAYS:
            assert services[name]["depends_on"][relay]["condition"] == "service_healthy", name


def test_only_front_doors_are_published(services: dict[str, dict]) -> None:
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == PUBLISHED


def test_dependencies_wait_for_health_and_one_shots(services: dict[str, dict]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            cond = spec["condition"]
            if cond == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck"
            elif cond == "service_completed_successfully":
                assert services[dep].get("restart", "no") == "no", f"{dep} is not one-shot"
            else:
                assert cond == "service_started", f"{name}: odd condition {cond}"
    for name in ("origin", *RELAYS, "orchestrator", "validator", "trainer"):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert "/healthz" in test, f"{name} healthcheck does not use /healthz"
    for name in ("validator", "trainer", *worker_services(services)):
        assert services[name]["depends_on"]["deployer"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["trainer"]["depends_on"]["model-init"]["condition"] == (
        "service_completed_successfully"
    )
    assert "warm_start" in " ".join(services["model-init"]["command"])


def secrets_of(service: dict) -> dict[str, str]:
    """Secret source -> the path it has in the service's container."""
    out = {}
    for item in service.get("secrets") or []:
        if isinstance(item, str):
            item = {"source": item}
        source = item["source"]
        target = item.get("target") or source
        out[source] = target if target.startswith("/") else f"/run/secrets/{target}"
    return out


def test_each_service_mounts_only_its_own_key(services: dict[str, dict]) -> None:
    key_secrets = set().union(*KEY_SECRET.values(), WORKER_KEY_SECRETS)
    (worker,) = worker_services(services)
    for name, svc in services.items():
        mounted = secrets_of(svc)
        held = key_secrets & set(mounted)
        if name == worker:
            # The pool, and nothing else: no Redis password, no other role's secret.
            assert set(mounted) == WORKER_KEY_SECRETS, f"{name} mounts {set(mounted)}"
            assert sorted(Path(mounted[k]).name for k in WORKER_KEY_SECRETS) == sorted(
                f"worker-key-{i}.json" for i in range(compose_secrets.WORKER_KEYS)
            )
            assert svc["command"][0] == "prime-claim-key"
            assert "PRIME_WORKER_KEY_FILE" not in env_of(svc)  # set by the claim
            continue
        if name not in KEY_SECRET:
            assert not held, f"{name} mounts {held}"
            continue
        assert held == KEY_SECRET[name], f"{name} mounts keys {held}"
        prefix = prefix_of(name)
        (secret,) = KEY_SECRET[name]
        assert env_of(svc)[f"{prefix}KEY_FILE"] == mounted[secret]
    # The deployer registers and funds by address; keys no longer live in the shared volume.
    assert set(secrets_of(services["deployer"])) == {"addresses"}
    deployer_secrets = secrets_of(services["deployer"])
    assert env_of(services["deployer"])["SWARM_ADDRESSES_FILE"] == deployer_secrets["addresses"]
    for name, svc in services.items():
        for volume in svc.get("volumes") or []:
            assert "/keys" not in volume, f"{name} mounts a key folder: {volume}"


def test_deployer_reads_the_addresses_compose_secrets_writes(
    deployer: ModuleType, tmp_path: Path
) -> None:
    from prime_swarm.deploy import compose_secrets
    from prime_swarm.libs.chain.keyfile import load_key

    out = tmp_path / "secrets"
    compose_secrets.generate(out)
    trainer, validator, workers = deployer.read_addresses(out / "addresses.json")
    assert trainer == load_key(out / "trainer-key.json").address
    assert validator == load_key(out / "validator-key.json").address
    assert workers == [
        load_key(out / f"worker-{i}-key.json").address for i in range(compose_secrets.WORKER_KEYS)
    ]
    with pytest.raises(SystemExit, match="compose-secrets"):
        deployer.read_addresses(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------ secrets


def test_redis_requires_a_user_per_role(services: dict[str, dict]) -> None:
    from prime_swarm.deploy import redis_acl

    redis = services["redis"]
    command = redis["command"]
    acl_path = command[command.index("--aclfile") + 1]
    assert secrets_of(redis)["redis_acl"] == acl_path
    assert "--appendonly" in command
    health = " ".join(redis["healthcheck"]["test"])
    assert "--user healthcheck" in health
    assert secrets_of(redis)["redis_healthcheck_password"] in health
    for name, svc in services.items():
        env = env_of(svc)
        urls = {k: v for k, v in env.items() if k.endswith("_REDIS_URL")}
        if name not in REDIS_ROLE:
            assert not urls, f"{name} should not reach Redis"
            assert not {s for s in secrets_of(svc) if s.startswith("redis_")} - (
                {"redis_acl", "redis_healthcheck_password"} if name == "redis" else set()
            ), f"{name} mounts a Redis password"
            continue
        role = REDIS_ROLE[name]
        assert role in redis_acl.ROLES
        ((var, url),) = urls.items()
        # The user only: the entrypoint adds the password from the service's own secret.
        assert url == f"redis://{role}@redis:6379/0", f"{name}: {var}={url}"
        own = f"redis_{role}_password"
        assert {s for s in secrets_of(svc) if s.startswith("redis_")} == {own}
        assert env["SWARM_REDIS_PASSWORD_FILE"] == secrets_of(svc)[own]


def test_no_password_is_in_the_environment(services: dict[str, dict]) -> None:
    for name, svc in services.items():
        for var, value in env_of(svc).items():
            if "PASSWORD" in var or "SECRET" in var:
                assert var.endswith("_FILE"), f"{name}: {var} holds a secret"
            assert not re.search(r"://[^/@:]+:[^/@]+@", value), f"{name}: {var} has a password"


def test_compose_secrets_are_the_files_the_generator_writes(compose: dict, tmp_path: Path) -> None:
    from prime_swarm.deploy import compose_secrets

    made = tmp_path / "secrets"
    compose_secrets.generate(made)
    ha = yaml.safe_load(HA_FILE.read_text())
    files = {}
    for name, spec in {**compose["secrets"], **ha["secrets"]}.items():
        m = re.fullmatch(r"\$\{SWARM_SECRETS_DIR:-\./deploy/docker/secrets\}/(.+)", spec["file"])
        assert m, f"secret {name}: {spec['file']} is not under SWARM_SECRETS_DIR"
        files[name] = m.group(1)
    # The host-side roles' passwords are read on the host (the books), by no container; the
    # replica's and the Sentinels' only where docker-compose.ha.yml runs them.
    host_side = {compose_secrets.password_file(r) for r in compose_secrets.HOST_SIDE_ROLES}
    assert set(files.values()) == {p.name for p in made.iterdir()} - host_side
    assert set(ha["secrets"]) == {"redis_replica_password", "redis_sentinel_password"}
    assert (ROOT / ".gitignore").read_text().count("deploy/docker/secrets/") == 1
    assert "deploy/docker/secrets" in (ROOT / ".dockerignore").read_text().split()
    # Each file is owned by the user of the container that reads it (bind-mounted as is), in
    # either file: the redis image's user, Grafana's, or ours.
    stock_image_owners = {
        "redis": compose_secrets.REDIS_OWNER,
        "grafana/grafana": compose_secrets.GRAFANA_OWNER,
    }
    readers: dict[str, set[tuple[int, int]]] = {}
    for services in (compose["services"], ha["services"]):
        for svc_name, svc in services.items():
            image = (svc.get("image") or compose["services"][svc_name]["image"]).split(":")[0]
            owner = stock_image_owners.get(image, compose_secrets.PRIME_OWNER)
            for source in secrets_of(svc):
                readers.setdefault(files[source], set()).add(owner)
    for file, owners in readers.items():
        assert owners == {compose_secrets.owner_of(file)}, f"{file} is read as {owners}"
    uid = compose_secrets.PRIME_OWNER[0]
    assert f"--uid {uid} " in DOCKERFILE.read_text()


def test_entrypoint_puts_the_password_into_the_redis_url(tmp_path: Path) -> None:
    secret = tmp_path / "redis_password"
    secret.write_text("Abc_123-xyz\n")
    base = {"PATH": os.environ["PATH"], "SWARM_REDIS_PASSWORD_FILE": str(secret)}

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(ENTRYPOINT), "env"], env={**base, **env},
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    ok = run(PRIME_TRAINER_REDIS_URL="redis://trainer@redis:6379/0")
    assert ok.returncode == 0, ok.stderr
    assert "PRIME_TRAINER_REDIS_URL=redis://trainer:Abc_123-xyz@redis:6379/0" in ok.stdout
    assert run(PRIME_TRAINER_REDIS_URL="redis://redis:6379/0").returncode != 0  # no user
    assert run(PRIME_TRAINER_REDIS_URL="redis://t:pw@redis:6379/0").returncode != 0
    # docker-compose.ha.yml: the data nodes' password into a Sentinel URL, after the user.
    sentinels = "redis+sentinel://trainer@s-1:26379,s-2:26379/prime/0"
    ok = run(PRIME_TRAINER_REDIS_URL=sentinels)
    assert ok.returncode == 0, ok.stderr
    assert (
        "PRIME_TRAINER_REDIS_URL=redis+sentinel://trainer:Abc_123-xyz@s-1:26379,s-2:26379/prime/0"
        in ok.stdout
    )
    assert run(PRIME_TRAINER_REDIS_URL="redis+sentinel://s-1:26379/prime/0").returncode != 0
    assert run(PRIME_TRAINER_REDIS_URL="redis+sentinel://t:pw@s-1:26379/prime").returncode != 0
    assert run(PRIME_TRAINER_REDIS_URL="rediss://trainer@redis:6379/0").returncode != 0
    assert run().returncode != 0  # a password with no URL to put it in is a mistake
    secret.write_text("has space")
    assert run(PRIME_TRAINER_REDIS_URL="redis://trainer@redis:6379/0").returncode != 0


# ------------------------------------------------------------------------------------ networks


def networks_of(service: dict) -> set[str]:
    nets = service.get("networks") or {}
    return set(nets) if isinstance(nets, (list, dict)) else set()


def test_networks_keep_workers_and_metrics_apart(compose: dict, services: dict[str, dict]) -> None:
    assert compose["networks"]["backend"].get("internal") is True
    assert compose["networks"][WORKER_METRICS_NET].get("internal") is True
    assert not (compose["networks"]["public"] or {}).get("internal")
    for name, svc in services.items():
        # Explicit everywhere: an unlisted service would land on a `default` network.
        assert networks_of(svc) or svc.get("network_mode") == "none", f"{name} names no network"
        assert "default" not in networks_of(svc)
    for name in BACKEND_ONLY:
        assert networks_of(services[name]) == {"backend"}, name
    for name in PUBLIC:
        assert networks_of(services[name]) == {"backend", "public"}, name
    assert networks_of(services["prometheus"]) == {"backend", WORKER_METRICS_NET}
    for name in worker_services(services):
        assert networks_of(services[name]) == {"public", WORKER_METRICS_NET}, name
    on_public = {n for n, svc in services.items() if "public" in networks_of(svc)}
    # anvil stands in for a public chain that workers must reach to stake.
    assert on_public == PUBLIC | {"anvil"} | set(worker_services(services))
    on_worker_metrics = {n for n, s in services.items() if WORKER_METRICS_NET in networks_of(s)}
    assert on_worker_metrics == {"prometheus", *worker_services(services)}


def test_monitoring_override_publishes_on_loopback_only(services: dict[str, dict]) -> None:
    override = yaml.safe_load(MONITORING_FILE.read_text())
    assert set(override["services"]) == {"prometheus", "grafana"}
    for name, svc in override["services"].items():
        assert svc["ports"] and all(p.startswith("127.0.0.1:") for p in svc["ports"]), name
        # The base file's networks, and the otherwise empty `monitoring` to publish from.
        assert set(svc["networks"]) == networks_of(services[name]) | {"monitoring"}, name


# ------------------------------------------------------------------------------------ observability


def test_prometheus_scrapes_every_metrics_endpoint(services: dict[str, dict]) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]}  # fmt: skip
    expected = {
        f"origin:{env_of(services['origin'])['PRIME_RELAY_PORT']}",
        *(f"{r}:{env_of(services[r])['PRIME_RELAY_PORT']}" for r in RELAYS),
        f"orchestrator:{env_of(services['orchestrator'])['PRIME_ORCH_PORT']}",
        f"trainer:{env_of(services['trainer'])['PRIME_TRAINER_METRICS_PORT']}",
        f"validator:{env_of(services['validator'])['PRIME_VALIDATOR_METRICS_PORT']}",
    }
    assert expected <= targets
    # Scaled workers: every replica, by the service's DNS name (one A record per replica).
    (worker,) = worker_services(services)
    port = int(env_of(services[worker])["PRIME_WORKER_METRICS_PORT"])
    assert port > 0 and env_of(services[worker])["PRIME_WORKER_METRICS_HOST"] == "0.0.0.0"
    dns = [sd for job in config["scrape_configs"] for sd in job.get("dns_sd_configs", [])]
    assert dns == [{"names": [worker], "type": "A", "port": port, "refresh_interval": "15s"}]
    (job,) = [j for j in config["scrape_configs"] if "dns_sd_configs" in j]
    # A worker is a contributor's process: bounded scrapes.
    assert job["sample_limit"] > 0 and job["body_size_limit"] and job["label_limit"] > 0
    assert networks_of(services[worker]) & networks_of(services["prometheus"])


DASHBOARDS = {
    # Dashboard -> metrics it must chart (issue: training, pool and relays views).
    "training": ("trainer_batch_mean_reward", "trainer_consumption_lag_versions_bucket",
                 "trainer_stale_dropped_total", "trainer_step_seconds_sum",
                 "trainer_step_seconds_count", "trainer_idle_seconds", "trainer_busy_fraction",
                 "trainer_batch_reward_part", "trainer_step_stat"),
    "pool": ("orchestrator_workers_registered", "orchestrator_submissions_total",
             "validator_verdicts_total", "validator_attested_units_total",
             "worker_submissions_total", "worker_refused_total", 'up{job="worker"}'),
    "relays": ("shardcast_bytes_served_total", "shardcast_latest_version",
               "shardcast_versions_held", "shardcast_upstream_errors_total",
               "shardcast_shards_rejected_total"),
}  # fmt: skip


# PromQL words that are not series names; `up` is the one series Prometheus itself makes.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
                "and", "or", "unless", "inf", "nan"}  # fmt: skip
PROMETHEUS_SERIES = {"up"}


def metric_names(expr: str) -> set[str]:
    """Every series name a PromQL expression selects: identifiers left once strings, label
    matchers, groupings and ranges are gone, other than function calls and keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    words = re.findall(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\()", expr)
    return {w for w in words if w.lower() not in PROMQL_WORDS}


def test_metric_names_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, instance) (rate(a_seconds_bucket{job="x"}[5m])))'
        ' / on (instance) group_left b_total offset 5m + count(up{job="w"} == 1) * 60'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "up"}


def _exported_metrics(tmp_path: Path) -> set[str]:
    """Every metric name the services export, with the suffixes Prometheus derives."""
    from prometheus_client import REGISTRY

    import prime_swarm.services.orchestrator.metrics  # noqa: F401
    import prime_swarm.services.trainer.metrics  # noqa: F401
    import prime_swarm.services.validator.metrics  # noqa: F401
    import prime_swarm.services.worker.metrics  # noqa: F401
    from prime_swarm.libs.shardcast import VersionStore
    from prime_swarm.services.relay.metrics import RelayMetrics

    relay = RelayMetrics(VersionStore(tmp_path / "store"), "relay").registry
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created")
    return {m.name + x for reg in (REGISTRY, relay) for m in reg.collect() for x in suffixes}


def test_prometheus_alert_rules_are_mounted_and_watch_exported_series(
    services: dict[str, dict], tmp_path: Path
) -> None:
    """Every rule file prometheus.yml names is mounted beside it, and every series a rule
    watches is one a service exports (a misspelt name would never fire)."""
    folder = ROOT / "deploy" / "prometheus"
    config = yaml.safe_load((folder / "prometheus.yml").read_text())
    mounts = services["prometheus"]["volumes"]
    rules = []
    for name in config["rule_files"]:
        assert f"./deploy/prometheus/{name}:/etc/prometheus/{name}:ro" in mounts
        groups = yaml.safe_load((folder / name).read_text())["groups"]
        rules += [rule for group in groups for rule in group["rules"]]
    exported = _exported_metrics(tmp_path)
    for rule in rules:
        watched = metric_names(rule["expr"])
        assert watched and watched <= exported, (rule["alert"], watched - exported)
    alerts = {rule["alert"]: rule for rule in rules}
    # An environment's bug holds honest work unpaid: the operator is paged on the first hold.
    assert "validator_env_nondeterministic_total" in alerts["EnvironmentNotDeterministic"]["expr"]


def test_grafana_is_provisioned_with_the_dashboards(tmp_path: Path) -> None:
    grafana = ROOT / "deploy" / "grafana"
    ds = yaml.safe_load((grafana / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    files = sorted(p.stem for p in (grafana / "dashboards").glob("*.json"))
    assert files == sorted(DASHBOARDS)
    exported = _exported_metrics(tmp_path)
    uids, titles = set(), set()
    for name, wanted in DASHBOARDS.items():
        dash = json.loads((grafana / "dashboards" / f"{name}.json").read_text())
        uids.add(dash["uid"])
        titles.add(dash["title"])
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        for metric in wanted:
            assert any(metric in e for e in exprs), f"{name} does not chart {metric}"
        # Every series a panel selects is one a service exports (or Prometheus's own `up`).
        for metric in sorted(set().union(*map(metric_names, exprs))):
            assert metric in exported | PROMETHEUS_SERIES, f"{name}: no service exports {metric}"
        for panel in dash["panels"]:
            assert panel["datasource"]["uid"] == source["uid"]
            assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
    assert len(uids) == len(titles) == len(DASHBOARDS) and all(titles)
    home = env_of(yaml.safe_load(COMPOSE_FILE.read_text())["services"]["grafana"])
    assert Path(home["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]).stem in DASHBOARDS


# ------------------------------------------------------------------------------------ compose


def compose_config(files: list[Path], secrets: Path) -> dict:
    """What compose makes of `files` (no engine needed). Not skipped when docker-compose is
    missing: `make setup` installs it, so a missing one is a setup to fix, not a pass."""
    from prime_swarm.deploy import compose_secrets

    assert shutil.which("docker-compose"), (
        "docker-compose is not on PATH: run `make setup` (it installs Debian's docker-compose, "
        "or: apt-get install -y docker-compose)"
    )
    compose_secrets.generate(secrets)
    args = [a for f in files for a in ("-f", str(f))]
    result = subprocess.run(
        ["docker-compose", *args, "config"], cwd=ROOT, capture_output=True, text=True,
        timeout=60, env={**os.environ, "SWARM_SECRETS_DIR": str(secrets)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize(
    "files",
    [[COMPOSE_FILE], [COMPOSE_FILE, MONITORING_FILE], [COMPOSE_FILE, HA_FILE],
     [COMPOSE_FILE, HA_FILE, MONITORING_FILE]],
    ids=["base", "with-monitoring", "with-ha", "with-ha-and-monitoring"],
)  # fmt: skip
def test_docker_compose_config_is_valid(files: list[Path], tmp_path: Path) -> None:
    """Compose itself reads the files, overrides merged in."""
    merged = compose_config(files, tmp_path / "secrets")
    published = {n for n, svc in merged["services"].items() if svc.get("ports")}
    extra = {"prometheus", "grafana"} if MONITORING_FILE in files else set()
    if HA_FILE in files:
        extra.add("orchestrator-lb")
    assert published == PUBLISHED | extra
    # What compose makes of the networks, override merged in: the workers reach only `public`
    # and Prometheus; Prometheus keeps the worker network with the monitoring file too.
    nets = {n: set(svc.get("networks") or {}) for n, svc in merged["services"].items()}
    publishing = {"monitoring"} if MONITORING_FILE in files else set()
    assert nets["prometheus"] == {"backend", WORKER_METRICS_NET} | publishing
    assert nets["grafana"] == {"backend"} | publishing
    assert nets["worker"] == {"public", WORKER_METRICS_NET}
    assert merged["services"]["worker"]["deploy"]["replicas"] == WORKERS
    for spec in merged["secrets"].values():
        assert Path(spec["file"]).is_file(), spec["file"]


# ------------------------------------------------------------------------------------ HA override

HA_LOCAL_FILE = ROOT / "deploy" / "docker" / "compose.ha.local.yml"
HAPROXY_CONFIG = ROOT / "deploy" / "haproxy" / "orchestrators.cfg"
HA_START = ROOT / "deploy" / "redis" / "ha-start.sh"
ORCHESTRATORS = ("orchestrator", "orchestrator-2", "orchestrator-3")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
SENTINEL_PORT = 26379


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """docker-compose.yml with docker-compose.ha.yml, as compose merges them."""
    secrets = tmp_path_factory.mktemp("ha") / "secrets"
    return compose_config([COMPOSE_FILE, HA_FILE], secrets)["services"]


def test_ha_every_redis_client_finds_the_primary_through_the_sentinels(
    ha: dict[str, dict],
) -> None:
    from prime_swarm.libs.localnet import redis_ha
    from prime_swarm.libs.streams.connection import SentinelURL

    assert sorted(n for n in ha if n.startswith("sentinel-")) == list(SENTINELS)
    hosts = ",".join(f"{s}:{SENTINEL_PORT}" for s in SENTINELS)
    clients = {n: s for n, s in ha.items() if any(k.endswith("_REDIS_URL") for k in env_of(s))}
    assert set(clients) == {*ORCHESTRATORS, "validator", "trainer"}
    for name, svc in clients.items():
        role = "orchestrator" if name in ORCHESTRATORS else REDIS_ROLE[name]
        ((var, url),) = [(k, v) for k, v in env_of(svc).items() if k.endswith("_REDIS_URL")]
        assert url == f"redis+sentinel://{role}@{hosts}/{redis_ha.SERVICE}/0", f"{name}: {var}"
        parsed = SentinelURL.parse(url)
        assert parsed.username == role and parsed.password is None  # the entrypoint adds it
        assert env_of(svc)["SWARM_REDIS_PASSWORD_FILE"] == secrets_of(svc)[f"redis_{role}_password"]
        # Started once the Sentinels could authorize a failover and the replica is up.
        for dep in (*SENTINELS, "redis-replica"):
            assert svc["depends_on"][dep]["condition"] == "service_healthy", (name, dep)


def test_ha_redis_nodes_and_sentinels_log_in_as_their_own_users(ha: dict[str, dict]) -> None:
    from prime_swarm.deploy import redis_acl
    from prime_swarm.libs.localnet import redis_ha

    for name in ("redis", "redis-replica", *SENTINELS):
        svc = ha[name]
        env = env_of(svc)
        # The Sentinels' settings are libs/localnet/redis_ha.py's, which the local runs test.
        assert env["REDIS_HA_SERVICE"] == redis_ha.SERVICE
        assert int(env["REDIS_HA_QUORUM"]) == redis_ha.QUORUM
        assert int(env["REDIS_HA_DOWN_AFTER_MS"]) == redis_ha.DOWN_AFTER_MS
        assert int(env["REDIS_HA_FAILOVER_TIMEOUT_MS"]) == redis_ha.FAILOVER_TIMEOUT_MS
        assert env["REDIS_HA_NAME"] == name  # its DNS name: the service's
        assert env["REDIS_HA_PRIMARY"] == "redis"
        assert env["REDIS_HA_SENTINELS"].split() == list(SENTINELS)
        sentinel = name.startswith("sentinel-")
        user = "sentinel" if sentinel else "replica"
        assert env["REDIS_HA_USER"] == user and user in redis_acl.ROLES
        assert env["REDIS_HA_PASSWORD_FILE"] == secrets_of(svc)[f"redis_{user}_password"]
        assert svc["command"][:3] == ["sh", "/usr/local/bin/prime-redis-ha",
                                      "sentinel" if sentinel else "node"]  # fmt: skip
        assert f"{HA_START}:/usr/local/bin/prime-redis-ha:ro" in svc["volumes"]
        assert networks_of(svc) == {"backend"}
        assert not svc.get("ports")
        assert svc["user"] == "999:999"  # the owner of its secrets (compose_secrets.REDIS_OWNER)
        # A lost name fails within a second (x-fast-dns), not after Docker's 20 s.
        assert svc["dns_opt"] == ["timeout:1", "attempts:1", "no-aaaa"], name
        if sentinel:
            assert set(secrets_of(svc)) == {"redis_sentinel_password"}
            assert "ckquorum" in " ".join(svc["healthcheck"]["test"])
            continue
        # Both data nodes: the base file's Redis (the ACL, the append-only file), either role.
        command = svc["command"]
        assert secrets_of(svc)["redis_acl"] == command[command.index("--aclfile") + 1]
        assert command[command.index("--appendonly") + 1] == "yes"
        assert "--user healthcheck" in " ".join(svc["healthcheck"]["test"])
        assert set(secrets_of(svc)) == {
            "redis_acl", "redis_healthcheck_password", "redis_replica_password"
        }  # fmt: skip
        assert any(v.endswith(":/data") or v.endswith(":/data:rw") for v in svc["volumes"]), name
    assert ha["redis-replica"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_ha_orchestrator_replicas_are_the_base_files_orchestrator(ha: dict[str, dict]) -> None:
    first = ha["orchestrator"]
    for name in ORCHESTRATORS[1:]:
        svc = ha[name]
        for key in ("image", "command", "environment", "secrets", "networks", "volumes",
                    "depends_on", "healthcheck", "restart"):  # fmt: skip
            assert svc.get(key) == first.get(key), f"{name}: {key} differs from orchestrator's"
        assert svc["build"]["args"] == first["build"]["args"]
        assert Path(svc["build"]["dockerfile"]).name == Path(first["build"]["dockerfile"]).name
        assert not svc.get("ports"), f"{name} is reached through orchestrator-lb"
    replicas = sorted(n for n, s in ha.items() if s.get("image", "").startswith("prime-swarm-orch"))
    assert replicas == list(ORCHESTRATORS)


def test_ha_the_balancer_is_the_pools_address(ha: dict[str, dict]) -> None:
    port = int(env_of(ha["orchestrator"])["PRIME_ORCH_PORT"])
    lb = ha["orchestrator-lb"]
    assert env_of(ha["deployer"])["SWARM_ORCHESTRATOR_URL"] == f"http://orchestrator-lb:{port}"
    # The workers' network: they reach the pool through it, and it nothing of the backend.
    assert networks_of(lb) == {"public"}
    assert [p["target"] for p in lb["ports"]] == [port]
    config = lb["command"][lb["command"].index("-f") + 1]
    assert f"{HAPROXY_CONFIG}:{config}:ro" in lb["volumes"]
    for name in ORCHESTRATORS:
        assert lb["depends_on"][name]["condition"] == "service_healthy"
        assert "public" in networks_of(ha[name])
    assert "/healthz" in " ".join(lb["healthcheck"]["test"])
    for name in worker_services(ha):
        assert ha[name]["depends_on"]["orchestrator-lb"]["condition"] == "service_healthy"


def test_ha_the_committed_haproxy_config_is_the_balancers_render(ha: dict[str, dict]) -> None:
    """deploy/haproxy/orchestrators.cfg is libs/localnet/balancer.haproxy_config for the compose
    replicas, so the local balancer and the compose one never drift. To make it again:
    .venv/bin/python -c 'from prime_swarm.libs.localnet.balancer import haproxy_config as h;
    print(h(("0.0.0.0", 8000), [(n, 8000) for n in ("orchestrator", "orchestrator-2",
    "orchestrator-3")]), end="")' > deploy/haproxy/orchestrators.cfg"""
    from prime_swarm.libs.localnet.balancer import haproxy_config

    port = int(env_of(ha["orchestrator"])["PRIME_ORCH_PORT"])
    expected = haproxy_config(("0.0.0.0", port), [(name, port) for name in ORCHESTRATORS])
    assert HAPROXY_CONFIG.read_text() == expected


def test_ha_local_override_names_local_images_for_what_ha_adds(ha: dict[str, dict]) -> None:
    """compose.ha.local.yml gives every service docker-compose.ha.yml adds the image `make images`
    makes (deploy/docker/images.py) or its local build, as compose.local.yml does for the base."""
    images = load_script(ROOT / "deploy" / "docker" / "images.py", "compose_images")
    local = yaml.safe_load((ROOT / "deploy" / "docker" / "compose.local.yml").read_text())
    ha_local = yaml.safe_load(HA_LOCAL_FILE.read_text())["services"]
    added = set(yaml.safe_load(HA_FILE.read_text())["services"]) - set(
        yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    )
    assert set(ha_local) == added
    for name in added:
        if "build" in ha[name]:
            assert ha_local[name]["build"] == local["services"]["orchestrator"]["build"], name
        else:
            assert ha_local[name]["image"] in images.INFRA_IMAGES.values(), name
    assert images.INFRA_IMAGES["haproxy"] == ha_local["orchestrator-lb"]["image"]
    assert "haproxy" in images.BASE_PACKAGES[images.INFRA].split(",")
    assert "AS haproxy" in (ROOT / "deploy" / "docker" / "infra.Dockerfile").read_text()


def _ha_start(
    tmp_path: Path, service: dict, kind: str, primary: str | None, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """deploy/redis/ha-start.sh as `service` runs it, with a redis-cli that answers as the
    Sentinels would (`primary`; None: no Sentinel answers) and a redis-server that prints the
    config it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "redis-cli").write_text(
        "#!/bin/sh\n" + ("exit 1\n" if primary is None else f"echo {primary}; echo 6379\n")
    )
    (bin_dir / "redis-server").write_text('#!/bin/sh\ncat "$1"; echo "ARGS: $*"\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    secret = tmp_path / "password"
    secret.write_text("Pw_0123456789-abcdef\n")
    env = {
        **env_of(service),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "REDIS_HA_PASSWORD_FILE": str(secret),
        "REDIS_HA_DIR": str(tmp_path / "conf"),
        "REDIS_HA_STARTED": str(tmp_path / "started"),
        "REDIS_HA_WAIT_S": "2",
    }
    out = subprocess.run(["sh", str(HA_START), kind, *args], env=env, capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    return out, tmp_path / "conf"


def test_ha_start_asks_the_sentinels_which_node_is_the_primary(tmp_path: Path) -> None:
    services = yaml.safe_load(HA_FILE.read_text())["services"]
    node_args = ("--appendonly", "yes")
    # The first start of the set: no Sentinel answers, `redis` is the primary.
    out, conf = _ha_start(tmp_path / "a", services["redis"], "node", None, *node_args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "masteruser replica" in lines and "masterauth Pw_0123456789-abcdef" in lines
    assert "replica-announce-ip redis" in lines
    assert not [ln for ln in lines if ln.startswith("replicaof")]
    assert lines[-1] == f"ARGS: {conf / 'redis.conf'} --appendonly yes"
    assert (conf / "redis.conf").stat().st_mode & 0o077 == 0  # it holds a password
    out, _ = _ha_start(tmp_path / "b", services["redis-replica"], "node", None, *node_args)
    assert "replicaof redis 6379" in out.stdout.splitlines()
    # After a failover the Sentinels name the replica: the old primary comes back as its replica.
    out, _ = _ha_start(tmp_path / "c", services["redis"], "node", "redis-replica", *node_args)
    assert "replicaof redis-replica 6379" in out.stdout.splitlines()
    out, _ = _ha_start(tmp_path / "d", services["redis-replica"], "node", "redis-replica")
    assert not [ln for ln in out.stdout.splitlines() if ln.startswith("replicaof")]
    # Restarted in the same container (its mark from the first start): it waits for the
    # Sentinels rather than take the first primary's role on its own (REDIS_HA_WAIT_S here 2 s).
    started = time.monotonic()
    again, _ = _ha_start(tmp_path / "d", services["redis-replica"], "node", None)
    assert "waiting for a Sentinel" in again.stderr
    assert time.monotonic() - started >= 2
    assert (tmp_path / "d" / "started").exists()


def test_ha_start_writes_a_sentinel_config_of_names(tmp_path: Path) -> None:
    from prime_swarm.libs.localnet import redis_ha

    services = yaml.safe_load(HA_FILE.read_text())["services"]
    out, conf = _ha_start(tmp_path / "a", services["sentinel-2"], "sentinel", None)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    svc = redis_ha.SERVICE
    monitor = f"sentinel monitor {svc} redis 6379 {redis_ha.QUORUM}"
    # Names are resolved only once resolve-hostnames is on: it must come first.
    assert lines.index("sentinel resolve-hostnames yes") < lines.index(monitor)
    assert "sentinel announce-hostnames yes" in lines
    assert "sentinel announce-ip sentinel-2" in lines
    assert f"sentinel down-after-milliseconds {svc} {redis_ha.DOWN_AFTER_MS}" in lines
    assert f"sentinel failover-timeout {svc} {redis_ha.FAILOVER_TIMEOUT_MS}" in lines
    assert f"sentinel auth-user {svc} sentinel" in lines
    assert f"sentinel auth-pass {svc} Pw_0123456789-abcdef" in lines
    assert f"port {SENTINEL_PORT}" in lines
    assert lines[-1] == f"ARGS: {conf / 'sentinel.conf'} --sentinel"
    # A Sentinel that restarts after a failover watches the primary the others name.
    out, _ = _ha_start(tmp_path / "b", services["sentinel-1"], "sentinel", "redis-replica")
    assert f"sentinel monitor {svc} redis-replica 6379 {redis_ha.QUORUM}" in out.stdout
    # A password that would break a config line is refused.
    bad, _ = _ha_start(tmp_path / "c", services["sentinel-1"], "sentinel", None)
    assert bad.returncode == 0
    (tmp_path / "c" / "password").write_text("two words")
    env = {**env_of(services["sentinel-1"]), "PATH": os.environ["PATH"],
           "REDIS_HA_PASSWORD_FILE": str(tmp_path / "c" / "password"),
           "REDIS_HA_DIR": str(tmp_path / "c" / "conf")}  # fmt: skip
    refused = subprocess.run(["sh", str(HA_START), "sentinel"], env=env, capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    assert refused.returncode == 1 and "URL-safe" in refused.stderr
