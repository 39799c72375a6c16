"""A checkpoint keeps the fp32 master weights and, when the pool ships another precision, a copy
in that precision beside them: the directory the trainer publishes."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.io import load_pretrained, load_weights_like
from prime_swarm.libs.model.tokenizer import build_tokenizer
from prime_swarm.libs.rl import checkpoint as ckpt


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    (path,) = model_dir.glob("*.safetensors")
    return load_file(path)


def test_a_bf16_copy_is_written_beside_the_master_and_published(tmp_path: Path) -> None:
    module, tok = init_tiny_model(3), build_tokenizer()
    ckpt.save_checkpoint(tmp_path, module, tok, ckpt.TrainerState(step=0))
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    state = {k: v + 1e-4 if v.is_floating_point() else v for k, v in state.items()}
    ckpt.save_checkpoint(
        tmp_path, module, tok, ckpt.TrainerState(step=1), state, publish_dtype=torch.bfloat16
    )
    # v0 was saved without a publish precision: its master directory is what ships.
    assert ckpt.published_dir(tmp_path, 0) == ckpt.model_dir(tmp_path, 0)
    published = ckpt.published_dir(tmp_path, 1)
    assert published == ckpt.version_dir(tmp_path, 1) / ckpt.PUBLISHED_DIR
    master, shipped = weights(ckpt.model_dir(tmp_path, 1)), weights(published)
    assert master.keys() == shipped.keys()
    for name, t in master.items():
        assert t.dtype == torch.float32 and shipped[name].dtype == torch.bfloat16
        # The snapshot, not the live module, and rounded to nearest.
        assert torch.equal(shipped[name], state[name].to(torch.bfloat16))
        assert torch.equal(t, state[name])
    # A client holding the fp32 start takes the bf16 version on its fast path (same config
    # and tokenizer files), its values exactly the shipped ones.
    base = load_pretrained(ckpt.model_dir(tmp_path, 0))
    loaded = load_weights_like(base, published)
    assert isinstance(loaded, CausalLM)
    for name, t in loaded.module.state_dict().items():
        if name in shipped:
            assert torch.equal(t, shipped[name].float())


def test_the_master_precision_writes_no_copy(tmp_path: Path) -> None:
    module, tok = init_tiny_model(3), build_tokenizer()
    ckpt.save_checkpoint(
        tmp_path, module, tok, ckpt.TrainerState(step=0), publish_dtype=torch.float32
    )
    assert not (ckpt.version_dir(tmp_path, 0) / ckpt.PUBLISHED_DIR).exists()
    assert ckpt.published_dir(tmp_path, 0) == ckpt.model_dir(tmp_path, 0)


def test_tied_weights_are_published_once(tmp_path: Path) -> None:
    """SmolLM2's head is its embedding: the bf16 copy keeps them one tensor, so the published
    file holds it once (a copy per name shipped the embedding twice, 21 % of SmolLM2's bytes),
    and the snapshot the trainer saves from keeps the tie too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from prime_swarm.libs.rl.distributed import _unshared

    cfg = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    module = LlamaForCausalLM(cfg)
    snapshot = _unshared(module.state_dict(), list(module.parameters()))
    head, embed = snapshot["lm_head.weight"], snapshot["model.embed_tokens.weight"]
    assert head is embed and head.data_ptr() != module.lm_head.weight.data_ptr()
    ckpt.save_checkpoint(
        tmp_path, module, build_tokenizer(), ckpt.TrainerState(step=1), snapshot,
        publish_dtype=torch.bfloat16,
    )  # fmt: skip
    shipped = weights(ckpt.published_dir(tmp_path, 1))
    assert "lm_head.weight" not in shipped
    assert torch.equal(shipped["model.embed_tokens.weight"], embed.to(torch.bfloat16))
    published = ckpt.published_dir(tmp_path, 1)
    reloaded = LlamaForCausalLM.from_pretrained(published)
    assert torch.equal(reloaded.lm_head.weight, reloaded.model.embed_tokens.weight)
    # A worker's fast reload path takes it: the one tensor fills both names.
    fast = load_weights_like(load_pretrained(ckpt.model_dir(tmp_path, 1)), published)
    assert fast is not None
    assert torch.equal(fast.module.lm_head.weight, shipped["model.embed_tokens.weight"].float())
