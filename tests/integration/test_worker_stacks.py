"""A worker says what it runs, and a pool refuses what it cannot verify before anything is
staked (real orchestrator, Redis and anvil): the pool's requirements read over HTTP, the
machine's own stack checked against them in one line naming what to install, and registration
refusing a stack the recipe does not accept."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.rollout.stacks import local_stack, stack_refusal
from prime_swarm.protocol.messages import (
    AcceptedStacks,
    EnvRelease,
    PoolRequirements,
    RegisterRequest,
)
from prime_swarm.services.worker.client import OrchestratorClient, OrchestratorError
from prime_swarm.services.worker.onboarding import JoinError, check_stack, read_standing
from prime_swarm.services.worker.settings import WorkerSettings

StartPool = Callable[..., AbstractContextManager[Any]]


def settings_for(live: Any, tmp_path: Path) -> WorkerSettings:  # noqa: ANN401
    return WorkerSettings(
        pool_id=live.pool_id,
        rpc_url=live.rpc_url,
        ledger_address=live.ledger,
        key_file=tmp_path / "k.json",
        precision="bf16",
    )


def test_the_pools_requirements_are_checked_before_staking_and_at_registration(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    env = {"PRIME_RECIPE_STACKS": json.dumps({"torch": ">=9"})}
    with start_live_pool(anvil, redis_server.url, tmp_path, env) as live:
        needs = PoolRequirements.model_validate(httpx.get(f"{live.url}/v1/requirements").json())
        assert needs.stacks.torch == ">=9" and [e.env for e in needs.environments] == ["reverse"]
        s = settings_for(live, tmp_path)
        standing = read_standing(live.ledger_as(live.outsider), s, live.outsider.address)
        with pytest.raises(JoinError) as err:
            check_stack(standing.pool, s, "cpu", live.outsider)
        line = str(err.value)
        assert "\n" not in line and "pip install 'torch>=9'" in line, line
        # The orchestrator checks again: a worker that skips the check is refused by name.
        stack = local_stack("hf", "bf16", device_class("cpu"), ["reverse"])
        client = OrchestratorClient(live.url, live.member, timeout_s=10, retry_budget=0)
        req = RegisterRequest(worker=live.member.address, pool_id=live.pool_id, stack=stack)
        with pytest.raises(OrchestratorError) as refused:
            client.register(req)
        assert refused.value.status == 422 and refused.value.reason == "unsupported_stack"


def test_a_stack_the_pool_verifies_joins_and_registers(
    anvil: Anvil, redis_server: RedisServer, tmp_path: Path, start_live_pool: StartPool
) -> None:
    with start_live_pool(anvil, redis_server.url, tmp_path) as live:
        s = settings_for(live, tmp_path)
        standing = read_standing(live.ledger_as(live.member), s, live.member.address)
        stack = check_stack(standing.pool, s, "cpu", live.member)
        assert stack is not None and stack.device_class == device_class("cpu")
        client = OrchestratorClient(live.url, live.member, timeout_s=10, retry_budget=0)
        req = RegisterRequest(worker=live.member.address, pool_id=live.pool_id, stack=stack)
        assert client.register(req).worker == live.member.address.lower()


def test_the_rule_names_what_to_install() -> None:
    stack = local_stack("hf", "bf16", "cpu-x86_64-avx2", ["reverse"])
    mine = stack.environments[0]
    needs = PoolRequirements(pool_id=1, stacks=AcceptedStacks(), environments=[mine])
    assert stack_refusal(stack, needs) is None
    old_python = stack.model_copy(update={"python": "3.10.13"})
    assert "Python 3.10.13" in (stack_refusal(old_python, needs) or "")
    assert stack_refusal(stack.model_copy(update={"torch": "2.14.1"}), needs) is None
    new_torch = stack.model_copy(update={"torch": "2.15.0"})
    assert "pip install 'torch>=2.13,<2.15'" in (stack_refusal(new_torch, needs) or "")
    # vLLM's release matters only to a vLLM worker.
    vllm = stack.model_copy(update={"backend": "vllm", "vllm": "0.31.0"})
    assert "pip install 'vllm==0.32.*'" in (stack_refusal(vllm, needs) or "")
    edited = EnvRelease(env="reverse", version=mine.version, content_hash="0" * 16)
    changed = stack.model_copy(update={"environments": [edited]})
    assert "unmodified" in (stack_refusal(changed, needs) or "")
    pinned = needs.model_copy(update={"stacks": AcceptedStacks(env_releases={"reverse": "9.9"})})
    assert "'prime-swarm==9.9'" in (stack_refusal(stack, pinned) or "")
