import json

import torch

from prime_swarm.libs.model.build import build_tiny_model
from prime_swarm.libs.model.io import load_pretrained, save_pretrained, weights_sha256


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    out = build_tiny_model(7, tmp_path / "m")
    model, tok = load_pretrained(out)
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    save_pretrained(model, tok, tmp_path / "copy")
    again, _ = load_pretrained(tmp_path / "copy")
    with torch.no_grad():
        assert torch.equal(model(ids)[0], again(ids)[0])
    assert weights_sha256(out) == weights_sha256(tmp_path / "copy")


def test_config_is_hf_style(tmp_path):
    out = build_tiny_model(0, tmp_path / "m")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "tiny_gpt"
    assert cfg["architectures"] == ["TinyGPTForCausalLM"]
    assert cfg["torch_dtype"] == "float32"
    assert {"vocab_size", "n_layer", "n_head", "n_embd", "block_size"} <= cfg.keys()
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_build_is_deterministic_and_overwrite_leaves_no_temp_dirs(tmp_path):
    a = build_tiny_model(1, tmp_path / "a")
    b = build_tiny_model(1, tmp_path / "b")
    assert weights_sha256(a) == weights_sha256(b)
    build_tiny_model(2, tmp_path / "a")  # replace in place
    assert weights_sha256(a) != weights_sha256(b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_load_casts_dtype(tmp_path):
    out = build_tiny_model(0, tmp_path / "m")
    model, _ = load_pretrained(out, dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training
