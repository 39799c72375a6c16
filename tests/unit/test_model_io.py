"""Model directories: the tiny Qwen2 written and read back as a Hugging Face directory."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, Qwen2ForCausalLM

from prime_swarm.libs.model.build import TINY_ARCH, build_tiny_model, init_tiny_model
from prime_swarm.libs.model.causal_lm import PRECISIONS, CausalLM
from prime_swarm.libs.model.io import (
    ModelDirError,
    load_pretrained,
    load_weights_like,
    save_pretrained,
    weights_sha256,
)
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(7, tmp_path_factory.mktemp("io") / "m")


def _ids(lm: CausalLM) -> torch.Tensor:
    return torch.tensor([prompt_ids(lm.tokenizer, "rev 4821=") + [lm.tokenizer.eos_token_id]])


def test_save_load_round_trip_gives_identical_logits(model_dir: Path, tmp_path: Path) -> None:
    lm = load_pretrained(model_dir)
    assert isinstance(lm, CausalLM) and isinstance(lm.module, Qwen2ForCausalLM)
    # A CausalLM saves as its module; the copy must be the same weights, bit for bit.
    copy = save_pretrained(lm, lm.tokenizer, tmp_path / "copy")
    again = load_pretrained(copy)
    ids = _ids(lm)
    with torch.no_grad():
        a, b = lm.module(ids).logits, again.module(ids).logits
        assert torch.equal(a, b)
        # ...and the same as the freshly initialised model that was saved in the first place.
        assert torch.equal(init_tiny_model(7)(ids).logits, a)
        assert torch.equal(lm.head_logits(lm.final_hidden(ids)), a)
    assert weights_sha256(model_dir) == weights_sha256(copy)
    assert again.eos_ids == lm.eos_ids == frozenset({258})
    assert again.pad_id == lm.pad_id == 256


def test_config_is_a_qwen2_hf_config(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["dtype"] == "float32"
    assert {k: cfg[k] for k in TINY_ARCH} == TINY_ARCH
    tok = build_tokenizer()
    assert cfg["vocab_size"] == len(tok)
    assert (cfg["pad_token_id"], cfg["bos_token_id"], cfg["eos_token_id"]) == (256, 257, 258)
    assert cfg["tie_word_embeddings"] is False
    # Any transformers install reads it without our code (no custom model_type, no remote code).
    auto = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    assert type(auto).__name__ == "Qwen2Config" and auto.hidden_size == TINY_ARCH["hidden_size"]
    names = sorted(p.name for p in model_dir.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl"))]  # no pickles


def test_build_is_deterministic_and_overwrite_leaves_no_temp_dirs(tmp_path: Path) -> None:
    a = build_tiny_model(1, tmp_path / "a")
    b = build_tiny_model(1, tmp_path / "b")
    assert weights_sha256(a) == weights_sha256(b)
    build_tiny_model(2, tmp_path / "a")  # replace in place
    assert weights_sha256(a) != weights_sha256(b)
    assert weights_sha256(a) == weights_sha256(build_tiny_model(2, tmp_path / "c"))
    # No hidden sibling temp or old dirs survive (".a.tmp-*", ".a.old-*").
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]


def test_init_does_not_touch_the_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    init_tiny_model(5)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_load_casts_dtype(model_dir: Path, dtype: torch.dtype) -> None:
    lm = load_pretrained(model_dir, dtype=dtype)
    assert lm.dtype == dtype
    assert all(p.dtype == dtype for p in lm.module.parameters())
    assert not lm.module.training
    # The head still computes in fp32 over the low-precision hidden states.
    ids = _ids(lm)
    with torch.no_grad():
        hidden = lm.final_hidden(ids)
        assert hidden.dtype == dtype
        logits = lm.head_logits(hidden)
        assert logits.dtype == torch.float32
        full = load_pretrained(model_dir)
        ref = full.head_logits(full.final_hidden(ids))
    assert torch.allclose(logits, ref, atol=0.1)


def test_missing_config_or_weights_is_a_model_dir_error(model_dir: Path, tmp_path: Path) -> None:
    no_config = tmp_path / "no_config"
    shutil.copytree(model_dir, no_config)
    (no_config / "config.json").unlink()
    with pytest.raises(ModelDirError, match="config.json"):
        load_pretrained(no_config)

    no_weights = tmp_path / "no_weights"
    shutil.copytree(model_dir, no_weights)
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    # A pickle in place of safetensors is not a substitute: it would be code.
    torch.save(init_tiny_model(7).state_dict(), no_weights / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match="safetensors"):
        load_pretrained(no_weights)

    with pytest.raises(ModelDirError):
        load_pretrained(tmp_path / "does_not_exist")


def test_unknown_model_type_is_a_model_dir_error(model_dir: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd"
    shutil.copytree(model_dir, odd)
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "model_type": "no_such_arch"}))
    with pytest.raises(ModelDirError):
        load_pretrained(odd)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_casting_equals_loading_in_that_precision(model_dir: Path, precision: str) -> None:
    # A worker loads its policy in its precision; the validator loads fp32 and casts. Both must
    # compute the same bits, buffers included (RoPE's inv_freq stays fp32 either way).
    direct = load_pretrained(model_dir, dtype=PRECISIONS[precision])
    cast = load_pretrained(model_dir).cast(precision)
    buffers = dict(direct.module.named_buffers())
    for name, buf in cast.module.named_buffers():
        assert buf.dtype == buffers[name].dtype and torch.equal(buf, buffers[name]), name
    ids = _ids(direct)
    with torch.no_grad():
        assert torch.equal(direct.final_hidden(ids), cast.final_hidden(ids))


def test_vllm_that_cannot_import_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from prime_swarm.libs.model.vllm_backend import VLLMBackendError, import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # what a broken or missing install looks like
    with pytest.raises(VLLMBackendError, match="make setup"):
        import_vllm()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_new_version_loads_into_a_copy_of_the_held_one(
    model_dir: Path, tmp_path: Path, precision: str
) -> None:
    dtype = PRECISIONS[precision]
    # Versions as the trainer writes them: each saved from the loaded model and tokenizer.
    first = load_pretrained(model_dir)
    held = load_pretrained(save_pretrained(first, first.tokenizer, tmp_path / "v1"), dtype=dtype)
    moved = load_pretrained(model_dir)
    with torch.no_grad():
        for p in moved.module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    new_dir = save_pretrained(moved, moved.tokenizer, tmp_path / "v2")
    fast = load_weights_like(held, new_dir)
    slow = load_pretrained(new_dir, dtype=dtype)
    assert fast is not None and fast.source == new_dir.resolve() and fast.dtype == dtype
    a, b = fast.module.state_dict(), slow.module.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The held version is untouched: it may still be generating or verifying.
    assert not torch.equal(held.module.lm_head.weight, fast.module.lm_head.weight)
    ids = _ids(slow)
    assert torch.equal(fast.final_hidden(ids), slow.final_hidden(ids))


def test_a_version_with_other_files_takes_the_full_load(model_dir: Path, tmp_path: Path) -> None:
    held = load_pretrained(model_dir)
    # A re-saved tokenizer serializes differently from the built one: not the same files.
    assert load_weights_like(held, save_pretrained(held, held.tokenizer, tmp_path / "a")) is None
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(cfg))
    assert load_weights_like(held, other) is None
    bigger = build_tiny_model(7, tmp_path / "bigger", hidden_size=64, intermediate_size=128)
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, bigger / f.name)  # the same files, other shapes in the weights
    assert load_weights_like(held, bigger) is None


def test_the_sampling_head_trains_with_the_model() -> None:
    """head_logits is the trainer's head too: the gradient must reach the head's weight (a
    detached fp32 copy would freeze it, and the held-out reward of `make up` would not rise)."""
    lm = CausalLM(init_tiny_model(1), build_tokenizer())
    hidden = torch.randn(3, lm.config.hidden_size)
    lm.head_logits(hidden).logsumexp(-1).sum().backward()
    grad = lm.module.get_output_embeddings().weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
