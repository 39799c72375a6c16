"""A policy as a Hugging Face directory anyone's tools load, and the check that they do.

`export_model` writes config, safetensors weights, generation config and tokenizer files (the chat
template with them, when the model has one) in the dtype asked. `check_export` then loads that
directory with nothing but transformers' Auto classes, as a user's tools would, and holds it
against the source as the project loads it (`io.load_pretrained`, in the same dtype): the same
prompt tokens, the same chat template, the same greedy tokens, logits within `LOGIT_TOLERANCE`.
Finding the source (a trainer version) is the caller's business: this folder knows nothing of
checkpoints.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .io import load_pretrained, save_pretrained
from .tokenizer import prompt_ids

CHECK_PROMPT = "What is 23 + 41?"
"""Short enough for the tiny model's 64-token context with the new tokens after it."""
CHECK_NEW_TOKENS = 16
LOGIT_TOLERANCE = 1e-5
"""Largest |logit difference| the check accepts. The export holds the source's weights rounded
as `load_pretrained(dtype=...)` rounds them, and both sides run the same transformers code in
one process, so the measured difference is 0.0 (tiny model and SmolLM2, fp32 and bf16). One
weight of the tiny model moved by a thousandth of its matrix's largest value shows as 3.7e-5,
and an fp32 export rounded through bf16 as 0.021, both with the greedy tokens unchanged."""
NEAR_TIE = {torch.float32: 1e-2, torch.bfloat16: 0.25}
"""vLLM computes with its own kernels: its greedy tokens are held to the source's up to the
first position whose top two logits are closer than this (fp32: the vllm backend's worst honest
replay gap was 0.006; bf16: one ulp at |logit| 32 is 0.25)."""


class ExportError(ValueError):
    """The output directory is refused; the message says why in one line."""


def export_model(source: Path, out: Path, dtype: torch.dtype, *, force: bool = False) -> Path:
    """Write the model directory `source` to `out` in `dtype` (atomically: a crash leaves no
    half-written `out`). An existing non-empty `out` is replaced only with `force`, and only if
    it is a model directory: `--force` must never empty a home folder given by mistake."""
    _refuse_out(Path(source), Path(out), force)
    lm = load_pretrained(source, dtype=dtype)
    written = save_pretrained(lm.module, lm.tokenizer, out)
    if isinstance(lm.tokenizer.chat_template, str):
        _template_in_tokenizer_config(written, lm.tokenizer.chat_template)
    return written


def _refuse_out(source: Path, out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    src, dst = source.resolve(), out.resolve()
    if dst == src or dst in src.parents or src in dst.parents:
        raise ExportError(f"{out} overlaps the source {source}")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(f"{out} exists and is not empty (--force replaces it)")
        if not (out / "config.json").is_file():
            raise ExportError(f"{out} is not empty and holds no config.json: not replaced")


def _template_in_tokenizer_config(out: Path, template: str) -> None:
    """transformers writes the template to chat_template.jinja only (since early 2025,
    huggingface/transformers#33957); older transformers and tools written before it (mlx-lm
    and swift-transformers learned the file in mid-2025) read tokenizer_config.json's key.
    transformers 5 prefers the .jinja file, so the two must agree: the same string."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer_config.", dir=out)
    with os.fdopen(fd, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_plain(out: Path) -> tuple[PreTrainedModel, object]:
    """What a user's tools see: transformers' Auto classes on the directory, no project code
    (the dtype is the one config.json names, as transformers 5 loads by default)."""
    module = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    return module.eval(), tokenizer


@dataclass(frozen=True)
class ExportCheck:
    dtype: torch.dtype
    """The dtype plain transformers loaded."""
    expected_dtype: torch.dtype
    same_prompt_ids: bool
    same_chat_template: bool
    has_chat_template: bool
    tokens: tuple[int, ...]
    """The export's greedy tokens."""
    reference_tokens: tuple[int, ...]
    """The source's greedy tokens, as the project loads it."""
    reference_gaps: tuple[float, ...]
    """The source's top-two logit gap at each of its greedy tokens."""
    prompt_ids: tuple[int, ...]
    max_logit_diff: float
    tolerance: float = LOGIT_TOLERANCE

    def problems(self) -> list[str]:
        wrong = []
        if self.dtype != self.expected_dtype:
            wrong.append(f"loads as {self.dtype}, not {self.expected_dtype}")
        if not self.same_chat_template:
            wrong.append("the chat template differs from the source's")
        if not self.same_prompt_ids:
            wrong.append("the tokenizer encodes the prompt differently")
        if self.tokens != self.reference_tokens:
            wrong.append("greedy tokens differ from the source's")
        if not self.max_logit_diff <= self.tolerance:  # also catches nan
            wrong.append(f"max |logit diff| {self.max_logit_diff:.3g} > {self.tolerance:g}")
        return wrong

    @property
    def ok(self) -> bool:
        return not self.problems()

    def agrees_with(self, tokens: Sequence[int], near_tie: float) -> bool:
        """`tokens` are the source's greedy tokens, up to its first near-tie (after which
        another engine's rounding may pick the other token honestly)."""
        for i, (ours, theirs) in enumerate(zip(self.reference_tokens, tokens, strict=False)):
            if self.reference_gaps[i] < near_tie:
                return True
            if ours != theirs:
                return False
        return len(tokens) == len(self.reference_tokens)


@torch.no_grad()
def check_export(
    source: Path,
    out: Path,
    dtype: torch.dtype,
    prompt: str = CHECK_PROMPT,
    new_tokens: int = CHECK_NEW_TOKENS,
) -> ExportCheck:
    """Load `out` with plain transformers and hold it against `source` loaded by the project
    in `dtype`: a bf16 export against the fp32 master would differ by the rounding asked for,
    and what is checked here is that the export is faithful, not what bf16 costs."""
    reference = load_pretrained(source, dtype=dtype)
    module, tokenizer = load_plain(out)
    ids = prompt_ids(reference.tokenizer, prompt)
    new_tokens = min(new_tokens, reference.context_len - len(ids))
    if new_tokens < 1:
        raise ValueError(f"the check prompt fills the model's {reference.context_len} positions")
    ref_tokens = _greedy(reference.module, ids, new_tokens)
    their_ids = prompt_ids(tokenizer, prompt)  # through apply_chat_template, if it has one
    tokens = _greedy(module, their_ids, new_tokens)
    # One forward pass over the source's sequence on both sides, every position compared.
    sequence = torch.tensor([ids + ref_tokens])
    ref_logits = reference.module(sequence).logits[0].float()
    logits = module(sequence).logits[0].float()
    top2 = ref_logits[len(ids) - 1 : -1].topk(2, dim=-1).values
    return ExportCheck(
        dtype=module.dtype,
        expected_dtype=dtype,
        same_prompt_ids=their_ids == ids,
        same_chat_template=tokenizer.chat_template == reference.tokenizer.chat_template,
        has_chat_template=bool(tokenizer.chat_template),
        tokens=tuple(tokens),
        reference_tokens=tuple(ref_tokens),
        reference_gaps=tuple((top2[:, 0] - top2[:, 1]).tolist()),
        prompt_ids=tuple(ids),
        max_logit_diff=float((logits - ref_logits).abs().max()),
    )


def _greedy(module: PreTrainedModel, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy `generate` (stops at the generation config's EOS)."""
    prompt = torch.tensor([ids])
    out = module.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        max_new_tokens=new_tokens,
    )
    return out[0, len(ids) :].tolist()


def vllm_greedy(out: Path, ids: Sequence[int], new_tokens: int) -> list[int]:
    """Greedy tokens of `LLM(model=out)`: vLLM loads the directory (weights, config and
    tokenizer) itself. Raises VLLMBackendError when vLLM cannot be imported or load it."""
    from .vllm_backend import VLLMBackendError, import_vllm

    vllm = import_vllm()
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    # CPU: eager and vLLM's native torch ops, as the vllm backend runs (they round like
    # transformers does); the directory's dtype and context length are vLLM's defaults.
    try:
        llm = vllm.LLM(
            model=str(out),
            enforce_eager=cpu,
            compilation_config={"custom_ops": ["none"]} if cpu else None,
            seed=0,
        )
    except Exception as exc:  # vLLM raises many kinds; the user needs the one line
        raise VLLMBackendError(
            f"vLLM {vllm.__version__} could not load {out}: {type(exc).__name__}: {exc}"
        ) from exc
    params = vllm.SamplingParams(temperature=0.0, max_tokens=new_tokens)
    (result,) = llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)
    return list(result.outputs[0].token_ids)
