"""Two consecutive policy versions at a model size, made here: SmolLM2-135M-Instruct itself, and
Qwen2's 1.5B and 7B shapes filled from SmolLM2's weights.

A larger shape takes each tensor's values from SmolLM2's tensor of the same role (embeddings,
attention and MLP projections, norms), drawn at random: the same bf16 exponents and spread,
which is what the delta codec and the hashes see. The next version is one AdamW-shaped step
away: each weight's fp32 master (its bf16 value plus an offset within its rounding interval)
moves by `STEP` in a random direction and is rounded to bf16 again, so a word changes when the
step crosses a rounding boundary, more often on small weights, as in training. `STEP` is set so
that about as many words change as in the real SmolLM2 steps after the first
(bench/results/wan.json `deltas`: 1.2-1.6 %); the share each version has is reported.

Files are sharded as Hugging Face saves them (at most `SHARD_BYTES` each), and made one tensor at
a time, so that a 7B version (15 GB) is built in a few GB of memory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from prime_swarm.libs.model.gguf_import import smollm2_dir

STEP = 1.2e-6
SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size, "5GB"
# Qwen2's published shapes: hidden, layers, MLP width, vocabulary, KV heads x head dim.
SHAPES = {
    "1.5b": {"hidden": 1536, "layers": 28, "mlp": 8960, "vocab": 151936, "kv": 256, "tied": True},
    "7b": {"hidden": 3584, "layers": 28, "mlp": 18944, "vocab": 152064, "kv": 512, "tied": False},
}
# SmolLM2 tensor each role copies its values from.
ROLE = {
    "embed_tokens": "model.embed_tokens.weight",
    "q_proj": "model.layers.{i}.self_attn.q_proj.weight",
    "k_proj": "model.layers.{i}.self_attn.k_proj.weight",
    "v_proj": "model.layers.{i}.self_attn.v_proj.weight",
    "o_proj": "model.layers.{i}.self_attn.o_proj.weight",
    "gate_proj": "model.layers.{i}.mlp.gate_proj.weight",
    "up_proj": "model.layers.{i}.mlp.up_proj.weight",
    "down_proj": "model.layers.{i}.mlp.down_proj.weight",
    "input_layernorm": "model.layers.{i}.input_layernorm.weight",
    "post_attention_layernorm": "model.layers.{i}.post_attention_layernorm.weight",
    "norm": "model.norm.weight",
}


def tensors(shape: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, role) of every tensor of a Qwen2-shaped model, in file order."""
    h, m, kv = shape["hidden"], shape["mlp"], shape["kv"]
    out = [("model.embed_tokens.weight", (shape["vocab"], h), "embed_tokens")]
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h), "q_proj"),
            (p + "self_attn.k_proj.weight", (kv, h), "k_proj"),
            (p + "self_attn.v_proj.weight", (kv, h), "v_proj"),
            (p + "self_attn.o_proj.weight", (h, h), "o_proj"),
            (p + "mlp.gate_proj.weight", (m, h), "gate_proj"),
            (p + "mlp.up_proj.weight", (m, h), "up_proj"),
            (p + "mlp.down_proj.weight", (h, m), "down_proj"),
            (p + "input_layernorm.weight", (h,), "input_layernorm"),
            (p + "post_attention_layernorm.weight", (h,), "post_attention_layernorm"),
        ]
    out.append(("model.norm.weight", (h,), "norm"))
    if not shape["tied"]:
        out.append(("lm_head.weight", (shape["vocab"], h), "embed_tokens"))
    return out


def stepped(words: np.ndarray, rng: np.random.Generator, chunk: int = 1 << 26) -> np.ndarray:
    """bf16 words (uint16) after one AdamW-shaped step of `STEP` (see the module's docstring),
    `chunk` words at a time (the fp32 temporaries of a 7B embedding would be 7 GB)."""
    flat = words.ravel()
    return np.concatenate([_step(flat[i : i + chunk], rng) for i in range(0, flat.size, chunk)])


def _step(words: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    value = (words.astype(np.uint32) << 16).view(np.float32)
    # A bf16 value's spacing: 2**(exponent - 7), 8 significant bits (zeros and subnormals: the
    # smallest normal's).
    exponent = np.maximum((words >> 7) & 0xFF, 1).astype(np.int32)
    ulp = np.ldexp(np.float32(1), exponent - 134)
    master = value + (rng.random(words.size, dtype=np.float32) - 0.5) * ulp
    master += np.where(rng.random(words.size, dtype=np.float32) < 0.5, -STEP, STEP)
    return _bf16(master)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bf16 words, rounding to nearest even (as torch's .to(torch.bfloat16))."""
    bits = x.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _drawn(pool: np.ndarray, n: int, rng: np.random.Generator, chunk: int = 1 << 26) -> np.ndarray:
    """`n` words drawn from `pool`, `chunk` at a time (the indices of a 7B embedding at once
    would take 4 GB)."""
    out = np.empty(n, np.uint16)
    for i in range(0, n, chunk):
        out[i : i + chunk] = pool[rng.integers(0, pool.size, min(chunk, n - i))]
    return out


def _save(vdir: Path, shard: dict[str, np.ndarray], fname: str) -> None:
    # safetensors' numpy writer has no bf16: the words go through torch's view of them.
    import torch
    from safetensors.torch import save_file

    out = {k: torch.from_numpy(v).view(torch.bfloat16) for k, v in shard.items()}
    save_file(out, vdir / fname, metadata={"format": "pt"})


def versions(name: str, cache: Path) -> tuple[Path, Path]:
    """(version k, version k+1) model directories of `name` (smollm2, 1.5b, 7b), made once."""
    root = cache / "weights" / name
    v1, v2 = root / "v1", root / "v2"
    if (root / ".done").exists():
        return v1, v2
    shutil.rmtree(root, ignore_errors=True)
    v1.mkdir(parents=True)
    v2.mkdir()
    src = smollm2_dir(cache / "models")
    smol = {}
    for f in sorted(src.glob("*.safetensors")):
        smol.update(load_file(f))
    rng = np.random.default_rng(0)
    # bf16 words of SmolLM2 (stored fp32 by the GGUF import), by tensor name.
    words = {k: _bf16(np.ascontiguousarray(v, dtype=np.float32)) for k, v in smol.items()}
    if name == "smollm2":
        plan = [(k, v.shape, k) for k, v in words.items()]
    else:
        plan = tensors(SHAPES[name])
    for vdir in (v1, v2):
        for f in src.iterdir():
            # SmolLM2's config describes only SmolLM2: the larger shapes ship weights alone.
            if (
                f.is_file()
                and f.suffix != ".safetensors"
                and (name == "smollm2" or f.name != "config.json")
            ):
                shutil.copy(f, vdir / f.name)
    # Shards by the order transformers fills them: a tensor starts a new shard when it would
    # take the current one past SHARD_BYTES.
    groups: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for item in plan:
        nbytes = 2 * int(np.prod(item[1]))
        if size and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += nbytes
    n = len(groups)
    weight_map = {}
    for i, group in enumerate(groups):
        fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        old_shard, new_shard = {}, {}
        for key, shp, role in group:
            if name == "smollm2":
                old = words[key]
            else:
                old = _drawn(words[ROLE[role].format(i=0)].ravel(), int(np.prod(shp)), rng)
                old = old.reshape(shp)
            old_shard[key], new_shard[key] = old, stepped(old, rng).reshape(shp)
            weight_map[key] = fname
        _save(v1, old_shard, fname)
        _save(v2, new_shard, fname)
        del old_shard, new_shard
    if n > 1:
        for vdir in (v1, v2):
            index = {"metadata": {}, "weight_map": weight_map}
            (vdir / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / ".done").touch()
    return v1, v2
