"""vLLM generation backend (optional extra `prime-swarm[vllm]`, GPU workers).

Written against vLLM's public interfaces: `LLM(model=..., dtype="bfloat16")`, `LLM.generate` with
`SamplingParams(logits_processors=[...])` (a per-request logits processor, available with the V0
engine: VLLM_USE_V1=0) and `LLM.apply_model` to register a forward pre-hook that captures the
final hidden states on their way into the model's logits processor. The logits processor turns
each step into the pool's seeded Gumbel-max choice (argmax of logits/T + noise(seed, sample,
position)), so greedy decoding in vLLM reproduces exactly the tokens a validator replays.

Not exercised on this project's CPU machines (vLLM needs a GPU); import is guarded so nothing
requires it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from prime_swarm.libs.rl.sampling import CapturedCompletion, gumbel_noise

try:  # optional dependency
    import vllm  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - exercised only where vLLM is installed
    vllm = None


def available() -> bool:
    return vllm is not None


class VLLMBackend:
    name = "vllm"

    def __init__(
        self, model_dir: str, precision: str = "bf16", gpu_memory_utilization: float = 0.5
    ):
        if vllm is None:
            raise RuntimeError("the vLLM backend needs `pip install prime-swarm[vllm]` on a GPU")
        os.environ.setdefault("VLLM_USE_V1", "0")  # per-request logits processors
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # hooks run in-process
        dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[precision]
        self.llm = vllm.LLM(
            model=model_dir,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=True,
            seed=0,
        )
        self._captured: list[torch.Tensor] = []
        self.llm.apply_model(self._install_hook)

    def _install_hook(self, model: torch.nn.Module) -> None:
        captured = self._captured

        def pre_hook(_module: torch.nn.Module, args: tuple) -> None:
            # LogitsProcessor.forward(lm_head, hidden_states, ...): the final hidden states.
            captured.append(args[1].detach().to(torch.bfloat16).cpu())

        model.logits_processor.register_forward_pre_hook(pre_hook)

    def generate(
        self,
        model: object,
        prompts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        group_size: int,
        max_new_tokens: int,
        temperature: float,
        eos_id: int,
    ) -> list[list[CapturedCompletion]]:
        """One request per (prompt, sample) so each row's hidden states stay addressable: rows
        are decoded one request at a time, every captured row belongs to that request."""
        out: list[list[CapturedCompletion]] = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            group = []
            for j in range(group_size):

                def gumbel(token_ids: list[int], logits: torch.Tensor, s=seed, j=j) -> torch.Tensor:
                    noise = gumbel_noise(s, j, len(token_ids), logits.shape[-1]).to(logits.device)
                    scores = logits.float() / temperature + noise if temperature > 0 else logits
                    forced = torch.full_like(logits, float("-inf"))
                    forced[int(scores.argmax())] = 0.0
                    return forced

                params = vllm.SamplingParams(
                    temperature=0.0,
                    max_tokens=max_new_tokens,
                    stop_token_ids=[eos_id],
                    logits_processors=[gumbel],
                    detokenize=False,
                )
                self._captured.clear()
                (res,) = self.llm.generate(
                    {"prompt_token_ids": list(prompt)}, params, use_tqdm=False
                )
                comp = res.outputs[0]
                tokens = list(comp.token_ids)
                # First captured tensor is the prefill (last prompt row predicts token 0), then
                # one row per decode step.
                rows = [self._captured[0][-1:]] + [h[-1:] for h in self._captured[1:]]
                hidden = torch.cat(rows)[: len(tokens)]
                finish = "eos" if tokens and tokens[-1] == eos_id else "length"
                group.append(CapturedCompletion(tokens, finish, [], hidden=hidden))
            out.append(group)
        return out
