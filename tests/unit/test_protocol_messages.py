import base64

import pytest
from pydantic import ValidationError

from prime_swarm.protocol import streams
from prime_swarm.protocol.messages import (
    PROTOCOL_VERSION,
    CompletionSample,
    Heartbeat,
    Lease,
    RolloutSubmission,
    SamplingParams,
    SubmittedRollout,
    normal_address,
)

WORKER = "0x" + "ab" * 20


def make_lease() -> Lease:
    return Lease(
        lease_id="l1",
        worker=WORKER,
        pool_id=1,
        work_id=0,
        env="reverse",
        task_id="train-1",
        prompt="abc",
        group_size=2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        seed=7,
        min_policy_version=0,
        expires_at=1e10,
    )


def make_submission(tokens: list[int]) -> RolloutSubmission:
    return RolloutSubmission(
        lease_id="l1",
        worker=WORKER,
        pool_id=1,
        task_id="train-1",
        policy_version=3,
        prompt_token_ids=[1, 2],
        completions=[CompletionSample(token_ids=tokens, finish_reason="eos", proof=b"\x00\xff")],
    )


def test_round_trip_through_a_stream_entry() -> None:
    entry = SubmittedRollout(submission_id="s", lease=make_lease(), submission=make_submission([5]))
    fields = {k.encode(): v.encode() for k, v in streams.encode(entry).items()}
    back = streams.decode(SubmittedRollout, fields)
    assert back == entry
    assert back.submission.completions[0].proof == b"\x00\xff"
    assert back.protocol_version == PROTOCOL_VERSION


def test_proof_bytes_are_base64_on_the_wire() -> None:
    js = make_submission([5]).model_dump(mode="json")
    assert js["completions"][0]["proof"] == base64.b64encode(b"\x00\xff").decode()


def test_unknown_fields_and_wrong_protocol_version_are_refused() -> None:
    data = make_lease().model_dump(mode="json")
    with pytest.raises(ValidationError):
        Lease.model_validate({**data, "surprise": 1})
    with pytest.raises(ValidationError):
        Lease.model_validate({**data, "protocol_version": 99})
    # A version-1 worker proves over another prefill: refused at the door, never judged.
    with pytest.raises(ValidationError):
        RolloutSubmission.model_validate(
            {**make_submission([1]).model_dump(mode="json"), "protocol_version": 1}
        )


def test_a_heartbeat_from_an_older_worker_drops_the_fields_it_lost() -> None:
    old = {"worker": WORKER, "pool_id": 1, "policy_version": 3, "rollouts_in_flight": 2}
    assert Heartbeat.model_validate(old) == Heartbeat(worker=WORKER, pool_id=1)


def test_an_address_arrives_lower_case_whatever_case_was_sent() -> None:
    checksummed = "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"
    assert Lease.model_validate({**make_lease().model_dump(), "worker": checksummed}).worker == (
        checksummed.lower()
    )
    assert normal_address(checksummed) == checksummed.lower() == normal_address(WORKER)
    for bad in ("0x123", checksummed + "\n", "ab" * 20, 42):
        with pytest.raises(ValueError):
            normal_address(bad)  # type: ignore[arg-type]


def test_bad_address_and_bad_base64_are_refused() -> None:
    data = make_submission([1]).model_dump(mode="json")
    with pytest.raises(ValidationError):
        RolloutSubmission.model_validate({**data, "worker": "0x123"})
    data["completions"][0]["proof"] = "not base64!"
    with pytest.raises(ValidationError):
        RolloutSubmission.model_validate(data)


def test_content_hash_ignores_who_submitted_but_not_what() -> None:
    a = make_submission([1, 2])
    b = a.model_copy(update={"worker": "0x" + "cd" * 20, "lease_id": "other"})
    assert a.content_hash() == b.content_hash()
    assert a.content_hash() != make_submission([1, 3]).content_hash()
