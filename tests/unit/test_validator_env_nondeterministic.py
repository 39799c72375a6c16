"""An environment's bug is never a worker's fault: honest multi-turn work of an environment whose
replies carry the wall clock (it slipped past the start check, or the operator started the pool
without it) fails the validator's replay as `context_mismatch`, and the second look at the
environment holds it instead: not trained on, not slashed, counted, and alerted on. So is work of
an environment that answers otherwise only on other machines (the second look's fresh process
runs on a made-up other host) or only now and then (the pool's record of the environment across
workers, libs/rollout/env_disputes.py). A worker that forges a deterministic environment's reply
is held until other workers witness the environment replaying, then rejected and slashed. Real
work of a real (tiny) model, the validator's own decision path and real Redis."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest
import redis
import unsteady_envs
from lease_answers import answer_lease
from prometheus_client import REGISTRY
from validator_loop import CHAIN_QUEUE, HERE, validator

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.environments.determinism import check_environments, own_uts_namespace
from prime_swarm.libs.environments.registry import args_key
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.env_disputes import blame
from prime_swarm.libs.rollout.pool_rates import Record, binomial_tail
from prime_swarm.libs.rollout.verify import Work, verify_batch
from prime_swarm.protocol import streams
from prime_swarm.protocol.env_records import ENV_GROUPS, ENV_MISMATCHES, env_key
from prime_swarm.protocol.messages import (
    Lease,
    PolicyAnnouncement,
    SamplingParams,
    SubmittedRollout,
    Verdict,
)

WORKER = "0x" + "ab" * 20

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(0, "cd" * 32, CausalLM(init_tiny_model(1), build_tokenizer()))


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clock-env and echo-count installed as plugins: the validator's fresh process finds them."""
    unsteady_envs.install(tmp_path / "site", monkeypatch)


def answered(policy: LoadedPolicy, env: str, n: int, worker: str = WORKER) -> SubmittedRollout:
    """An honest group of four episodes, played and proved by the hf worker's own path."""
    task_id = f"{env}/train/{n}"
    lease = Lease(
        lease_id=f"lease-{env}-{n}-{worker[-4:]}",
        worker=worker,
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
    return SubmittedRollout(submission_id=f"s-{env}-{n}-{worker[-4:]}", lease=lease, submission=sub)


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


def witness_record(
    r: redis.Redis, env: str, witnesses: dict[str, int], worker: str, mismatched: int
) -> None:
    """The pool's record of `env` across workers, as other validators would have written it:
    `witnesses`' clean groups, and `mismatched` groups of `worker` that failed to replay."""
    key = env_key(env, args_key(None))
    for w, n in witnesses.items():
        r.hincrby(ENV_GROUPS.format(env=key), w, n)
    if mismatched:
        r.hincrby(ENV_GROUPS.format(env=key), worker.lower(), mismatched)
        r.hincrby(ENV_MISMATCHES.format(env=key), worker.lower(), mismatched)


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
    # What the pool's validators recorded before: three other workers' groups of echo-count
    # replayed on their machines, and this worker's two before failed to (held, unsettled):
    # evidence from beyond this machine that the third forgery is the worker's doing.
    witness_record(redis_client, "echo-count", {"0x" + c * 40: 100 for c in "123"}, WORKER, 2)

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


def rejected_verdicts(r: redis.Redis) -> dict[str, Verdict]:
    return {
        x.submission_id: x
        for x in (streams.decode(Verdict, f) for _, f in r.xrange(streams.ROLLOUTS_REJECTED))
    }


def test_a_plugin_that_answers_otherwise_on_another_host_is_refused_at_start_and_held(
    plugins: None, policy: LoadedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not own_uts_namespace():
        pytest.skip("this machine gives no process a host name of its own (no UTS namespace)")
    problem = check_environments([("host-env", None)])
    assert problem is not None and "'host-env'" in problem
    # An honest worker on another host: the plugin reads that host's name as it plays.
    with monkeypatch.context() as m:
        m.setattr(socket, "gethostname", lambda: "contributor-b.example")
        entry = answered(policy, "host-env", 1)
    (d,) = verify_batch([Work(entry, policy)], device_class=HERE)
    assert d.judgement.refusal is not None and d.judgement.refusal.reason == "context_mismatch"
    assert d.action == "held" and d.refusal is not None
    assert d.refusal.reason == "env_nondeterministic", d.refusal.detail
    assert "a fresh one" in d.refusal.detail


def test_a_rarely_random_plugin_gets_no_honest_worker_slashed(
    plugins: None, policy: LoadedPolicy, redis_client: redis.Redis
) -> None:
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    workers = ["0x" + c * 40 for c in "123456"]
    # 36 groups of 12 replies: P(no group shows the rare branch) = 0.98**432 < 2e-4, and about
    # half of those that show it agree with themselves on the validator's three replays.
    entries = [answered(policy, "rare-env", n, workers[n % 6]) for n in range(36)]
    for msg in entries:
        redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(msg))
    v = validator(redis_client, policy)
    v.validate_batch(v.reader.read(len(entries), block_ms=100))
    verdicts = rejected_verdicts(redis_client)
    # One reply in fifty answers otherwise: some of these groups fail a replay ...
    assert len(verdicts) >= 2, "the rare branch never showed: nothing was tested"
    # ... and none is slashed: the environment's own record across the six workers says so.
    assert {x.reason for x in verdicts.values()} <= {"env_nondeterministic", "env_unsettled"}
    actions = [a.decode() for a in redis_client.lrange(CHAIN_QUEUE, 0, -1)]
    assert all('"attest"' in a for a in actions), actions
    assert redis_client.xlen(streams.ROLLOUTS_VERIFIED) + len(verdicts) == len(entries)


def test_a_forgery_is_held_before_witnesses_and_when_others_fail_too(
    plugins: None, policy: LoadedPolicy, redis_client: redis.Redis
) -> None:
    announce = PolicyAnnouncement(version=0, step=0, model_hash="h", manifest_path="v0/m")
    redis_client.xadd(streams.POLICY_ANNOUNCEMENTS, streams.encode(announce))
    first = forged(policy, answered(policy, "echo-count", 4))
    redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(first))
    v = validator(redis_client, policy)
    v.validate_batch(v.reader.read(10, block_ms=100))
    (verdict,) = rejected_verdicts(redis_client).values()
    # Nobody else has played echo-count yet: one machine's word, held.
    assert verdict.reason == "env_unsettled" and "only 0 other worker(s)" in verdict.detail
    assert redis_client.llen(CHAIN_QUEUE) == 0
    # Witnesses in, but another worker's group failed to replay too: the environment's.
    witness_record(
        redis_client, "echo-count", {"0x" + c * 40: 100 for c in "123"}, "0x" + "9" * 40, 1
    )
    again = forged(policy, answered(policy, "echo-count", 5))
    again = again.model_copy(update={"submission_id": "forged-again"})
    redis_client.xadd(streams.ROLLOUTS_SUBMITTED, streams.encode(again))
    v.validate_batch(v.reader.read(10, block_ms=100))
    verdict = rejected_verdicts(redis_client)["forged-again"]
    assert verdict.reason == "env_unsettled" and "1 other worker(s)" in verdict.detail
    assert redis_client.llen(CHAIN_QUEUE) == 0


def test_the_blame_rule() -> None:
    none = Record({"w": 1}, {"w": 1})
    assert not blame(none, "w", "e").worker
    witnessed = Record({"w": 3, "a": 100, "b": 100, "c": 100}, {"w": 3})
    assert blame(witnessed, "w", "e").worker  # (1/302)^3 < 1e-6
    once = Record({"w": 1, "a": 100, "b": 100, "c": 100}, {"w": 1})
    assert not blame(once, "w", "e").worker  # one mismatch in 301 groups: chance 3e-3
    rare = Record({"w": 50, "a": 500, "b": 500, "c": 500}, {"w": 5, "a": 0})
    assert blame(rare, "w", "e").worker  # 5 of 50 against 0 of 1,500
    disputed = Record({"w": 50, "a": 500, "b": 500, "c": 500}, {"w": 50, "a": 1})
    found = blame(disputed, "w", "e")
    assert not found.worker and found.environment_disputed
    assert binomial_tail(0, 10, 0.5) == 1.0 and binomial_tail(11, 10, 0.5) == 0.0
    assert abs(binomial_tail(1, 1, 0.25) - 0.25) < 1e-12
    assert abs(binomial_tail(2, 3, 0.5) - 0.5) < 1e-12
