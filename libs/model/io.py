"""Hugging Face-format model directories: config.json, model.safetensors, tokenizer.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from prime_swarm.libs.model.gpt import TinyGPT, TinyGPTConfig
from prime_swarm.libs.model.tokenizer import TOKENIZER_FILE, load_tokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_TYPE = "tiny_gpt"
ARCHITECTURE = "TinyGPTForCausalLM"


def _dtype_name(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def save_pretrained(model: TinyGPT, tokenizer: Tokenizer, out_dir: str | Path) -> Path:
    """Write the model directory atomically: readers see the old directory or the new one.

    The files go to a sibling temp dir that is renamed into place, so a crash never leaves a
    half-written model under `out_dir`.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other service users
        config = {
            "model_type": MODEL_TYPE,
            "architectures": [ARCHITECTURE],
            **model.config.to_dict(),
            "torch_dtype": _dtype_name(model),
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        tokenizer.save(str(tmp / TOKENIZER_FILE))
        if out.exists():
            # rename() cannot replace a non-empty directory, so move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "model")
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load_config(model_dir: str | Path) -> TinyGPTConfig:
    raw = json.loads((Path(model_dir) / CONFIG_FILE).read_text())
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(f"unsupported model_type {raw.get('model_type')!r}")
    fields = TinyGPTConfig.__dataclass_fields__
    return TinyGPTConfig(**{k: v for k, v in raw.items() if k in fields})


def load_pretrained(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> tuple[TinyGPT, Tokenizer]:
    """Load (model in eval mode, tokenizer); the weights must match the config exactly."""
    model = TinyGPT(load_config(model_dir))
    model.load_state_dict(load_file(str(Path(model_dir) / WEIGHTS_FILE)), strict=True)
    model.to(device=device, dtype=dtype).eval()
    return model, load_tokenizer(model_dir)


def weights_sha256(model_dir: str | Path) -> str:
    h = hashlib.sha256()
    with open(Path(model_dir) / WEIGHTS_FILE, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
