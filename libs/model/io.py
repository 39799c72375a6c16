"""Hugging Face-format model directories, read and written with transformers, never a hub.

A model directory holds `config.json`, `*.safetensors` and the tokenizer files. Weights are read
from safetensors only (`use_safetensors=True`): a policy arrives from the network, and a pickle
would be code.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from .causal_lm import CausalLM

# Services log JSON lines; transformers' per-load progress bars would interleave with them.
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()


class ModelDirError(ValueError):
    """The directory is not a loadable causal-LM directory; the message says why."""


def save_pretrained(
    model: PreTrainedModel | CausalLM, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """Write the model directory atomically: readers see the old directory or the new one.

    The files go to a sibling temp dir that is renamed into place, so a crash never leaves a
    half-written model under `out_dir`.
    """
    module = model.module if isinstance(model, CausalLM) else model
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other service users
        module.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
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


def load_pretrained(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> CausalLM:
    """Load any local HF causal LM (eval mode) with its tokenizer; nothing is fetched."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ModelDirError(f"{path} has no config.json: not a Hugging Face model directory")
    if not any(path.glob("*.safetensors")):
        raise ModelDirError(f"{path} has no *.safetensors weights")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, KeyError) as exc:  # unknown model_type and friends
        raise ModelDirError(f"{path}: {exc}") from exc
    module = AutoModelForCausalLM.from_pretrained(
        path,
        config=config,
        dtype=dtype,
        local_files_only=True,
        use_safetensors=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return CausalLM(module.to(device).eval(), tokenizer, path.resolve())


def once_per_tensor(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`fn` applied once per distinct tensor: names that share one (a head tied to the
    embedding) share the result, so a copy or a cast keeps the tie, and a file saved from it
    stores the tensor once."""
    done: dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}

    def apply(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == 0:  # every empty tensor has the same address
            return fn(t)
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key not in done:
            done[key] = fn(t)
        return done[key]

    return apply


def load_weights_like(base: CausalLM, model_dir: str | Path) -> CausalLM | None:
    """`model_dir` loaded as a copy of `base` with new weights, or None when that is not safe.

    A new policy version usually changes only its weights. Building the model again from its
    config costs 5x more than copying the loaded one and reading one safetensors file into it
    (14 ms against 3 ms for the tiny model), once per version in every worker and validator.
    Only a directory whose every other file is byte-identical to `base`'s, with one safetensors
    file holding exactly `base`'s parameter names and shapes, takes this path.
    """
    path = Path(model_dir)
    weights = sorted(path.glob("*.safetensors"))
    if base.source is None or len(weights) != 1:
        return None
    if _other_files(path) != _other_files(base.source):
        return None
    module = copy.deepcopy(base.module)
    try:
        state = load_file(weights[0], device=str(base.device))
        expected = module.state_dict()
        # The same names, but a tied weight (a head that is the embedding) is stored once:
        # a name may be missing only if its tensor is one the file fills under another name.
        filled = {expected[k].data_ptr() for k in state if k in expected}
        if state.keys() - expected.keys() or any(
            expected[k].data_ptr() not in filled for k in expected.keys() - state.keys()
        ):
            return None
        # load_state_dict refuses other shapes; values are cast to the loaded model's dtype,
        # as from_pretrained(dtype=...) does.
        module.load_state_dict(state, strict=False)
    except (RuntimeError, OSError, ValueError):
        return None
    return CausalLM(module.eval(), base.tokenizer, path.resolve())


def _other_files(model_dir: Path) -> dict[str, bytes] | None:
    """Every file but the weights, by name (config and tokenizer: small); None if unreadable
    (an evicted version's directory)."""
    try:
        return {
            f.name: f.read_bytes()
            for f in model_dir.iterdir()
            if f.is_file() and f.suffix != ".safetensors"
        }
    except OSError:
        return None


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over the (name, bytes) of every safetensors file, in name order."""
    h = hashlib.sha256()
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
