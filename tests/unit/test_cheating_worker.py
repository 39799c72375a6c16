"""The cheats of tests/support/cheating_worker.py change what a worker sends the way their names
say (the hostile-swarm run relies on each one being a real cheat, not a no-op)."""

from __future__ import annotations

import cheating_worker as cw
import pytest
from rollout_messages import submitted

from prime_swarm.protocol.messages import RolloutSubmission


def _sub(n: int = 1) -> RolloutSubmission:
    sub = submitted(n).submission
    comps = [c.model_copy(update={"token_ids": [5, 6, 7, 8], "claimed_reward": 0.5})
             for c in sub.completions * 2]  # fmt: skip
    return sub.model_copy(update={"completions": comps, "prompt_token_ids": [1, 2, 3]})


@pytest.mark.parametrize("kind", sorted(cw.SUBMISSION_CHEATS))
def test_each_submission_cheat_changes_the_submission(kind: str) -> None:
    honest = _sub()
    cheated = cw.SUBMISSION_CHEATS[kind](honest)
    assert cheated != honest
    assert cheated.lease_id == honest.lease_id  # still answers its own lease


def test_truncation_shortens_and_claims_eos() -> None:
    cheated = cw.truncated(_sub())
    assert any(len(c.token_ids) < 4 and c.finish_reason == "eos" for c in cheated.completions)


def test_weight_cheats_move_the_weights() -> None:
    import torch

    w = torch.randn(64, 64)
    near, other = cw.neighbour(w), cw.other_model(w)
    rel = ((near - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()).item()
    assert 0.005 < rel < 0.02  # about 1 % of the RMS
    assert not torch.allclose(other, w, atol=0.1)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(SystemExit, match="unknown kind"):
        cw.install("polite")


@pytest.mark.parametrize("kind", [*sorted(cw.SUBMISSION_CHEATS), "replayed_submission"])
def test_install_rewrites_what_the_client_sends(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the patched client: a kind whose patch is not installed sends honest work (the
    hostile run once caught exactly that: a 'replayer' accepted 6 times and never slashed)."""
    from prime_swarm.protocol.messages import SubmissionBatch
    from prime_swarm.services.worker.client import OrchestratorClient

    sent: list[SubmissionBatch] = []
    monkeypatch.setattr(OrchestratorClient, "submit_batch", lambda self, b: sent.append(b))
    cw.install(kind)
    subs = [
        _sub(i).model_copy(update={"prompt_token_ids": [i + 1], "task_id": f"t{i}"})
        for i in range(3)
    ]
    for batch in ([subs[0], subs[1]], [subs[2]]):
        OrchestratorClient.submit_batch(None, SubmissionBatch(worker=batch[0].worker, pool_id=1,
                                                              submissions=batch))  # fmt: skip
    out = [s for b in sent for s in b.submissions]
    assert [s.lease_id for s in out] == [s.lease_id for s in subs]
    changed = [a != b for a, b in zip(out, subs, strict=True)]
    if kind == "replayed_submission":
        assert changed == [False, True, True]  # the first is genuine, then only replays
        assert out[2].completions == subs[0].completions
    else:
        assert all(changed)
