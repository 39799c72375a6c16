"""The trainer against real Redis and a real origin: a crash mid-step neither loses rollouts nor
trains on any twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import torch
from eth_account import Account

from prime_swarm.libs.localnet.redis_server import RedisServer
from prime_swarm.libs.localnet.relay import RelayProcess
from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.model.tokenizer import prompt_ids
from prime_swarm.libs.rl.logprobs import token_logprobs
from prime_swarm.libs.rollout.verify import prefill_hidden
from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    PolicyAnnouncement,
    SamplingParams,
    Verdict,
    VerifiedCompletion,
    VerifiedRollout,
)
from prime_swarm.services.trainer.loop import TRAINED, Trainer
from prime_swarm.services.trainer.settings import TrainerSettings

WORKER = "0x" + "ab" * 20


def make_groups(model_dir: Path, n: int) -> list[VerifiedRollout]:
    """`n` verified groups as the validator would emit them: sampled by the `hf` backend, with
    log-probs recomputed from the validator's own prefill."""
    lm = load_pretrained(model_dir)
    prompt = prompt_ids(lm.tokenizer, "rev 567=")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    groups = HFBackend("bf16").generate(
        lm,
        [prompt] * n,
        list(range(n)),
        group_size=4,
        max_new_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature,
    )
    out = []
    for g, comps in enumerate(groups):
        hiddens = prefill_hidden(lm, [(prompt, c.token_ids) for c in comps], "fp32")
        with torch.no_grad():
            vcs = [
                VerifiedCompletion(
                    token_ids=c.token_ids,
                    logprobs=token_logprobs(
                        lm.head_logits(h), torch.tensor(c.token_ids), sampling.temperature
                    ).tolist(),
                    reward=float(i % 2),
                )
                for i, (c, h) in enumerate(zip(comps, hiddens, strict=True))
            ]
        verdict = Verdict(
            submission_id=f"s{g}",
            lease_id=f"l{g}",
            worker=WORKER,
            pool_id=1,
            accepted=True,
            units=1,
            validator=WORKER,
        )
        out.append(
            VerifiedRollout(
                submission_id=f"s{g}",
                worker=WORKER,
                task_id="reverse/train/1",
                policy_version=0,
                sampling=sampling,
                prompt_token_ids=prompt,
                completions=vcs,
                verdict=verdict,
            )
        )
    return out


@pytest.fixture
def origin(tmp_path: Path):  # noqa: ANN201
    trainer = Account.create()
    proc = RelayProcess(["origin", "--trainer", trainer.address], tmp_path / "origin")
    try:
        yield trainer, proc.wait_healthy().url
    finally:
        proc.stop()


def test_crash_between_save_and_ack(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis, origin
) -> None:  # noqa: ANN001
    account, origin_url = origin
    model_dir = build_tiny_model(3, tmp_path / "init")
    key_file = tmp_path / "trainer.json"
    from prime_swarm.protocol.keys import write_key

    write_key(key_file, account)
    settings = TrainerSettings(
        redis_url=redis_server.url,
        origin_url=origin_url,
        key_file=key_file,
        init_model_dir=model_dir,
        checkpoint_dir=tmp_path / "ckpt",
        groups_per_step=2,
        max_steps=3,
        reclaim_idle_ms=1,
    )
    groups = make_groups(model_dir, 4)
    for g in groups:
        redis_client.xadd(streams.ROLLOUTS_VERIFIED, streams.encode(g))

    first = Trainer(settings, account)
    assert first.step == 0
    # Crash in the middle of a step: weights saved and published, entries not yet acked.
    batch, _ids = first.collect()
    first.step += 1
    first.save([r.submission_id for r in batch])
    first.publish()
    crashed_on = {r.submission_id for r in batch}
    del first

    second = Trainer(settings, account)
    assert second.step == 1  # resumed from the saved version, not from scratch
    latest = streams.decode(
        PolicyAnnouncement, redis_client.xrevrange(streams.POLICY_ANNOUNCEMENTS, count=1)[0][1]
    )
    assert latest.version == 1
    row = second.train_step()
    assert row.step == 2 and row.groups == 2
    trained_at_v2 = set(json.loads((tmp_path / "ckpt" / "v2.trained.json").read_text()))
    # The reclaimed entries of the crashed step were skipped; the others trained exactly once.
    assert trained_at_v2 == {g.submission_id for g in groups} - crashed_on
    members = {m.decode() for m in redis_client.smembers(TRAINED)}
    assert members == {g.submission_id for g in groups}
    pending = redis_client.xpending(streams.ROLLOUTS_VERIFIED, streams.TRAINER_GROUP)
    assert pending["pending"] == 0
