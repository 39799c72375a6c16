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
