"""Leases drawn from a mixture of environments by weight, and live prompt selection, as the
orchestrator draws them against a real Redis (services/orchestrator/state.py `LeaseBook._draw`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from lease_books import lease_book, run
from redis.asyncio import Redis as AsyncRedis

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.selection import PromptSelection, prompt_key
from prime_swarm.protocol.selection_records import COUNTS, PASS_RATES
from prime_swarm.services.orchestrator.state import LeaseBook

WORKER = "0x" + "11" * 20
MIXTURE = [
    {"env": "reverse", "weight": 3},
    {"env": "arith"},
    {"env": "addition", "args": {"low": 1, "high": 3}},  # 6 distinct problems: they recur
]


@pytest.fixture
def flushed(redis_server: RedisServer) -> Iterator[str]:
    redis_server.client().flushall()
    yield redis_server.url


def book(r: AsyncRedis, recipe: Recipe) -> LeaseBook:
    return lease_book(r, max_in_flight_groups=10**6, recipe=recipe)


def test_leases_follow_the_weights_and_carry_their_environment(flushed: str) -> None:
    recipe = Recipe(mixture=MIXTURE)

    async def body(r: AsyncRedis) -> Counter[str]:
        leases = book(r, recipe)
        got = []
        for _ in range(20):
            got += (await leases.issue(WORKER, 1, 0, requested=50, cap=10**6))[0]
        for lease in got:
            env = load_env(lease.env, lease.env_args)
            assert lease.task_id.startswith(f"{lease.env}/train/")
            assert env.task_from_id(lease.task_id).prompt == lease.prompt
        return Counter(lease.env for lease in got)

    counts = run(flushed, body)
    assert sum(counts.values()) == 1000
    # Weights 3 : 1 : 1 over 1000 draws: binomial sd about 15 for 0.6, 13 for 0.2.
    assert counts["reverse"] == pytest.approx(600, abs=60)
    assert counts["arith"] == pytest.approx(200, abs=50)
    assert counts["addition"] == pytest.approx(200, abs=50)
    # The addition args travel with its leases; the others carry none.
    assert recipe.shares()[2].args == {"low": 1, "high": 3}


def test_selection_skips_learnt_and_hopeless_prompts_but_keeps_exploring(flushed: str) -> None:
    selection = PromptSelection(enabled=True, explore=0.1)
    recipe = Recipe(env="addition", env_args={"low": 1, "high": 3}, selection=selection)
    env = recipe.environment()

    async def body(r: AsyncRedis) -> tuple[Counter[str], dict[bytes, bytes]]:
        leases = book(r, recipe)
        # Every prompt this pool can pose (a handful: they recur), rated: 1 + 1 and 1 + 2 are
        # learnt, 3 + 3 is hopeless, the rest are learnable.
        prompts = {env.task_from_id(env.task_id("train", i)).prompt[0].content for i in range(200)}
        rates = {}
        for i in range(200):
            task = env.task_from_id(env.task_id("train", i))
            text = task.prompt[0].content
            rate = 1.0 if "1 + 1" in text or "1 + 2" in text or "2 + 1" in text else 0.5
            rates[prompt_key("addition", task.prompt)] = 0.0 if "3 + 3" in text else rate
        await r.hset(PASS_RATES, mapping=rates)
        got = []
        for _ in range(40):
            got += (await leases.issue(WORKER, 1, 0, requested=25, cap=10**6))[0]
        assert len(prompts) >= 4
        return Counter(lease.prompt[0].content for lease in got), await r.hgetall(COUNTS)

    by_prompt, counts = run(flushed, body)
    leased = sum(by_prompt.values())
    assert leased == 1000
    outside = sum(
        n for p, n in by_prompt.items() if any(x in p for x in ("1 + 1", "1 + 2", "2 + 1", "3 + 3"))
    )
    counted = {k.decode(): int(v) for k, v in counts.items()}
    # Outside the band only through the exploration floor (or a lease out of skips).
    assert outside == counted.get("addition:explored", 0) + counted.get("addition:forced", 0)
    assert 0 < outside < 0.15 * leased
    assert counted["addition:skipped"] > 0
    assert counted["addition:drawn"] == leased + counted["addition:skipped"]


def test_selection_off_leases_every_prompt_as_drawn(flushed: str) -> None:
    recipe = Recipe(env="addition", env_args={"low": 1, "high": 3})
    env = recipe.environment()

    async def body(r: AsyncRedis) -> tuple[list[str], dict[bytes, bytes]]:
        task = env.task_from_id(env.task_id("train", 0))
        await r.hset(PASS_RATES, prompt_key("addition", task.prompt), 1.0)
        got = (await book(r, recipe).issue(WORKER, 1, 0, requested=100, cap=10**6))[0]
        return [lease.task_id for lease in got], await r.hgetall(COUNTS)

    ids, counts = run(flushed, body)
    assert len(ids) == 100 and counts == {}
