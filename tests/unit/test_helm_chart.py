"""The Helm chart (deploy/helm/prime-swarm) renders, with Helm's own template engine
(.tools/chart-render: Go text/template + Sprig, built by `make setup`), into manifests that
Kubernetes' schemas accept (kubernetes-validate, strict), wired the way the services read their
settings: the trainer a torchrun Job, Redis and the chain from values, every relay known."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.services.orchestrator.settings import OrchestratorSettings
from prime_swarm.services.relay.settings import RelaySettings
from prime_swarm.services.trainer.settings import TrainerSettings
from prime_swarm.services.validator.settings import ValidatorSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "prime-swarm"
RENDER = ROOT / ".tools" / "chart-render"
K8S_VERSION = "1.30"
REQUIRED = {
    "redis.host": "redis.data.svc",
    "chain.rpcUrl": "http://geth.chain.svc:8545",
    "chain.ledgerAddress": "0x" + "11" * 20,
    "chain.poolId": "7",
    "trainer.address": "0x" + "22" * 20,
}
SETTINGS = {
    "PRIME_ORCH_": OrchestratorSettings,
    "PRIME_TRAINER_": TrainerSettings,
    "PRIME_VALIDATOR_": ValidatorSettings,
    "PRIME_RELAY_": RelaySettings,
    "PRIME_RECIPE_": Recipe,
}


def render(**overrides: str) -> list[dict]:
    args = [str(RENDER), str(CHART)]
    for key, value in {**REQUIRED, **overrides}.items():
        args += ["--set", f"{key}={value}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_name(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_renderer_is_built() -> None:
    assert RENDER.is_file(), "run `make setup`: it builds .tools/chart-render"


def test_the_chart_renders_valid_kubernetes_manifests() -> None:
    docs = render()
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == sorted([
        ("Deployment", "orchestrator"), ("Service", "orchestrator"),
        ("Deployment", "origin"), ("Service", "origin"), ("PersistentVolumeClaim", "origin-data"),
        ("StatefulSet", "relay"), ("Service", "relay"), ("Service", "relay-public"),
        ("Deployment", "validator"), ("PersistentVolumeClaim", "validator-cache"),
        ("Job", "trainer"), ("PersistentVolumeClaim", "trainer-checkpoints"),
    ])  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_refused_by_the_schema_check() -> None:
    """The validation above can fail: a mistyped field is an error."""
    job = by_name(render(), "Job", "trainer")
    job["spec"]["backoffLimit"] = "twenty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_each_required_value_is_named_when_missing(missing: str) -> None:
    args = [str(RENDER), str(CHART)]
    for key, value in REQUIRED.items():
        if key != missing:
            args += ["--set", f"{key}={value}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"{missing} is required" in out.stderr


def test_the_trainer_is_a_torchrun_job_with_its_ranks_from_values() -> None:
    job = by_name(render(**{"trainer.nprocPerNode": "4", "trainer.nnodes": "2"}), "Job", "trainer")
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"][0] == "torchrun"
    assert "--nproc-per-node=4" in c["args"] and "--nnodes=2" in c["args"]
    assert c["args"][-1].endswith("/prime-trainer")
    assert spec["restartPolicy"] == "OnFailure"  # resumes from its newest checkpoint
    assert env(c)["PRIME_TRAINER_ORIGIN_URL"] == "http://origin:8700"


def test_redis_and_chain_endpoints_come_from_values() -> None:
    docs = render()
    for kind, name, prefix, user in (
        ("Deployment", "orchestrator", "PRIME_ORCH_", "orchestrator"),
        ("Deployment", "validator", "PRIME_VALIDATOR_", "validator"),
        ("Job", "trainer", "PRIME_TRAINER_", "trainer"),
    ):
        (c,) = by_name(docs, kind, name)["spec"]["template"]["spec"]["containers"]
        e = env(c)
        url = e[f"{prefix}REDIS_URL"]
        assert url == f"redis://{user}:$(REDIS_PASSWORD)@redis.data.svc:6379/0"
        secret = next(x for x in c["env"] if x["name"] == "REDIS_PASSWORD")
        assert secret["valueFrom"]["secretKeyRef"]["key"] == user
        if name != "trainer":
            assert e[f"{prefix}RPC_URL"] == REQUIRED["chain.rpcUrl"]
            assert e[f"{prefix}LEDGER_ADDRESS"] == REQUIRED["chain.ledgerAddress"]
            assert e[f"{prefix}POOL_ID"] == "7"


def test_every_relay_is_handed_out_and_trusts_the_trainer() -> None:
    docs = render(**{"relays.replicas": "3"})
    assert by_name(docs, "StatefulSet", "relay")["spec"]["replicas"] == 3
    urls = [f"http://relay-{i}.relay:8701" for i in range(3)]
    for kind, name, var in (("Deployment", "orchestrator", "PRIME_ORCH_RELAYS"),
                            ("Deployment", "validator", "PRIME_VALIDATOR_RELAYS")):  # fmt: skip
        (c,) = by_name(docs, kind, name)["spec"]["template"]["spec"]["containers"]
        assert yaml.safe_load(env(c)[var]) == urls
    for kind, name in (("StatefulSet", "relay"), ("Deployment", "origin")):
        (c,) = by_name(docs, kind, name)["spec"]["template"]["spec"]["containers"]
        assert env(c)["PRIME_RELAY_TRUSTED_TRAINER"] == REQUIRED["trainer.address"]


def test_every_prime_variable_is_a_setting_of_its_service() -> None:
    for doc in render():
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        for c in (pod or {}).get("containers", []):
            for name in env(c):
                if not name.startswith("PRIME_"):
                    continue
                prefix = next(p for p in SETTINGS if name.startswith(p))
                field = name[len(prefix) :].lower()
                assert field in SETTINGS[prefix].model_fields, f"{name} is no setting"
