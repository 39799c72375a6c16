"""The two policy versions the time-to-N benchmark ships: SmolLM2-135M-Instruct as workers load
it (bf16, the `--model smollm2` preset's publish precision), and the version after it.

The second version is one AdamW-shaped step away from the first: every fp32 master weight moves
by the learning rate of the preset (5e-6) in a random direction, which is what an Adam step's
normalised update looks like element by element, and is then rounded to bf16 again. Its delta is
what a real step's delta costs in bytes to within the share of words the rounding flips (a real
step's share is measured by `python -m bench.wan --only deltas`, over steps of the network).
Both are built once into .cache/wan.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from prime_swarm.libs.model.gguf_import import smollm2_dir

LR = 5e-6  # deploy/local/settings.py REAL_MODEL_PRESET["lr"]


def _write(src: Path, out: Path, tensors: dict[str, torch.Tensor]) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, tmp / f.name)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    tmp.rename(out)


def versions(cache: Path) -> tuple[Path, Path]:
    """(version 1, version 2) model directories."""
    v1, v2 = cache / "wan" / "smollm2-bf16-v1", cache / "wan" / "smollm2-bf16-v2"
    if v1.is_dir() and v2.is_dir():
        return v1, v2
    src = smollm2_dir(cache / "models")
    fp32: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        fp32.update(load_file(f))
    if not v1.is_dir():
        _write(src, v1, {k: t.to(torch.bfloat16).contiguous() for k, t in fp32.items()})
    gen = torch.Generator().manual_seed(0)
    stepped = {}
    for k, t in fp32.items():
        direction = torch.randint(0, 2, t.shape, generator=gen).to(t.dtype) * 2 - 1
        stepped[k] = (t.float() + LR * direction).to(torch.bfloat16).contiguous()
    if not v2.is_dir():
        _write(src, v2, stepped)
    return v1, v2
