"""An environment's bug is never a worker's fault: honest multi-turn work of an environment whose
replies carry the wall clock (it slipped past the start check, or the operator started the pool
without it) fails the validator's replay as `context_mismatch`, and the second look at the
environment holds it instead: not trained on, not slashed, counted, and alerted on. A worker
that forges a deterministic environment's reply is still rejected and slashed. Real work of a
real (tiny) model, the validator's own decision path and real Redis."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import unsteady_envs
from lease_answers import answer_lease
from prometheus_client import REGISTRY

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.verify import Work, verify_batch
from prime_swarm.libs.streams.consumer import GroupReader
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    Lease,
    PolicyAnnouncement,
    SamplingParams,
    SubmittedRollout,
    Verdict,
)
from prime_swarm.services.validator.loop import Validator

HERE = device_class("cpu")
WORKER = "0x" + "ab" * 20
CHAIN_QUEUE = "validator:1:chain_queue"

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(0, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clock-env and echo-count installed as plugins: the validator's fresh process finds them."""
    unsteady_envs.install(tmp_path / "site", monkeypatch)


def answered(policy: LoadedPolicy, env: str, n: int) -> SubmittedRollout:
    """An honest group of four episodes, played and proved by the hf worker's own path."""
    task_id = f"{env}/train/{n}"
    lease = Lease(
        lease_id=f"lease-{env}-{n}",
        worker=WORKER,
        pool_id=1,
        work_id=n,
        env=env,
        task_id=task_id,
        prompt=load_env(env).task_from_id(task_id).prompt,
        group_size=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=4),
        seed=100 + n,
        min_policy_version=0,
        expires_at=time.time() + 3600,
    )
    sub = answer_lease(policy, lease, HFBackend("bf16"))
    assert all(len(c.sampled_spans) > 1 for c in sub.completions)  # replies between turns
    return SubmittedRollout(submission_id=f"s-{env}-{n}", lease=lease, submission=sub)


def forged(policy: LoadedPolicy, entry: SubmittedRollout) -> SubmittedRollout:
    """The group with completion 0's first reply token replaced: what a worker that forges the
    environment's reply submits."""
    comps = list(entry.submission.completions)
    ids = list(comps[0].token_ids)
    at = comps[0].sampled_spans[0][1]
    nine = policy.lm.tokenizer.encode("9", add_special_tokens=False)[0]
    ids[at] = nine if ids[at] != nine else nine + 1
    comps[0] = comps[0].model_copy(update={"token_ids": ids})
    sub = entry.submission.model_copy(update={"completions": comps})
    return entry.model_copy(update={"submission": sub, "submission_id": "forged"})


def test_honest_groups_of_an_environment_that_disagrees_with_itself_are_held(
    plugins: None, policy: LoadedPolicy
) -> None:
    entries = [answered(policy, "clock-env", n) for n in range(2)]
    decisions = verify_batch([Work(e, policy) for e in entries], device_class=HERE)
    for d in decisions:
        # The first replay blames the worker, as it did for the pool operator's 21 of 24 ...
        assert d.judgement.refusal is not None
        assert d.judgement.refusal.reason == "context_mismatch"
        # ... the second look at the environment finds it disagreeing with itself: held.
        assert d.action == "held" and d.completions == []
        assert d.refusal is not None and d.refusal.reason == "env_nondeterministic"
        assert "environment 'clock-env' is not deterministic" in d.refusal.detail
        assert "\n" not in d.refusal.detail


def test_a_forged_reply_of_a_deterministic_environment_is_still_rejected(
    plugins: None, policy: LoadedPolicy
) -> None:
    (d,) = verify_batch([Work(forged(policy, answered(policy, "echo-count", 7)), policy)])
    assert d.action == "reject" and d.judgement.environment is None
    assert d.refusal is not None and d.refusal.reason == "context_mismatch"
    assert "after turn 0" in d.refusal.detail


def validator(r: redis.Redis, policy: LoadedPolicy) -> Validator:
    """The validator's loop with everything but its chain client and policy downloads."""
    v = Validator.__new__(Validator)
    v.r = r
    v.settings = SimpleNamespace(
        recipe=Recipe(async_level=2),
        relays=["http://relay"],
        reward_tolerance=1e-6,
        audit_fraction=0.0,
    )
    v.reader = GroupReader(
        r, streams.ROLLOUTS_SUBMITTED, streams.VALIDATOR_GROUP, HERE, SubmittedRollout
    )
    v.held_reader = GroupReader(
        r, streams.ROLLOUTS_HELD, streams.held_group(HERE), HERE, SubmittedRollout
    )
    v.queue = SimpleNamespace(key=CHAIN_QUEUE)
    v.counts = defaultdict(int)
    v.device_class = HERE
    v.account = SimpleNamespace(address="0x" + "22" * 20)
    v.store = SimpleNamespace(get=lambda version, relays: policy)  # downloads tested elsewhere
    return v


def held_count(env: str) -> float:
    return REGISTRY.get_sample_value("validator_env_nondeterministic_total", {"env": env}) or 0.0


def test_the_validator_holds_counts_and_alerts_and_slashes_only_the_forger(
    plugins: None,
    policy: LoadedPolicy,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    honest = [answered(policy, "clock-env", n) for n in (1, 2)]
    cheat = forged(policy, answered(policy, "echo-count", 3))
    for msg in (*honest, cheat):
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(msg))
    before = held_count("clock-env")

    v = validator(redis_client, policy)
    with caplog.at_level(logging.ERROR, logger="validator"):
        v.validate_batch(v.reader.read(10, block_ms=100))

    verdicts = {
        x.submission_id: x
        for x in (
            streams.decode(Verdict, f) for _, f in redis_client.xrange(streams.ROLLOUTS_REJECTED)
        )
    }
    assert {verdicts[m.submission_id].reason for m in honest} == {"env_nondeterministic"}
    assert verdicts[cheat.submission_id].reason == "context_mismatch"
    # Only the forger is slashed; nothing goes to the trainer, and nothing waits for another
    # validator (none could settle an environment's bug: the operator fixes it).
    actions = [a.decode() for a in redis_client.lrange(CHAIN_QUEUE, 0, -1)]
    assert len(actions) == 1 and '"slash"' in actions[0] and '"work_id": 3' in actions[0]
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) == 0
    assert redis_client.xlen(streams.ROLLOUTS_HELD) == 0
    # Counted, and alerted on: a metric the alert rule watches, a log line at error level.
    assert v.counts["env_nondeterministic"] == 2
    assert held_count("clock-env") - before == 2
    alerts = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert alerts == ["environment 'clock-env' is not deterministic: work held, not slashed"] * 2
