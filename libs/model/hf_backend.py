"""The `hf` generation backend: transformers, batched, KV-cached, seeded Gumbel-max sampling.

All completions of a call share one left-padded batch and one KV cache: one prefill of the
prompts, then one forward of a single token per row and step; the next token is the argmax of
the fp32 logits, tempered, plus the row's seeded noise. Prompts of different lengths share the
batch (one batch generates 1.4-2x faster than a batch per prompt length; the padding moves the
decode's numbers no more than batching does). Proofs are not the backend's business: they
commit to one prefill of the chosen tokens, libs/rollout/recompute.prefill_hidden.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from prime_swarm.libs.model.logprobs import token_logprobs
from prime_swarm.libs.model.noise import gumbel_rows, perturbed_scores
from prime_swarm.libs.model.padding import pad_left

from .backend import Generation, GroupGeneration, SampleRow, check_request
from .causal_lm import CausalLM


class HFBackend(GroupGeneration):
    name = "hf"

    def __init__(self, precision: str = "bf16") -> None:
        self.precision = precision

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
        lm = lm.cast(self.precision)
        device = lm.device
        ids, attn = pad_left([list(r.context) for r in rows], lm.pad_id)
        ids, attn = ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=lm.config)
        last = lm.final_hidden(ids, attn, positions, cache)[:, -1]
        n, eos = len(rows), torch.tensor(sorted(lm.eos_ids), device=device)
        tokens = torch.zeros((n, max_new_tokens), dtype=torch.long)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32)
        length = torch.full((n,), max_new_tokens, dtype=torch.long)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        for k in range(max_new_tokens):
            logits = lm.head_logits(last)
            if temperature > 0:
                keys = [(r.seed, r.sample, r.offset + k) for r in rows]
                noise = gumbel_rows(keys, logits.shape[-1], device)
                chosen = perturbed_scores(logits, temperature, noise).argmax(dim=-1)
            else:
                chosen = logits.argmax(dim=-1)
            tokens[:, k] = chosen.cpu()
            logprobs[:, k] = token_logprobs(logits, chosen, temperature).cpu()
            ended = torch.isin(chosen, eos) & ~done
            length[ended.cpu()] = k + 1
            done |= ended
            if bool(done.all()) or k == max_new_tokens - 1:
                break
            # Finished rows keep decoding (their tokens are discarded): the batch stays
            # rectangular, which costs little at these group sizes and keeps the cache simple.
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            last = lm.final_hidden(chosen[:, None], attn, positions, cache)[:, -1]
        chosen_ids = [tokens[i, : int(length[i])].tolist() for i in range(n)]
        return [
            Generation(
                token_ids=chosen_ids[i],
                finish_reason="eos" if bool(done[i]) else "length",
                logprobs=logprobs[i, : len(chosen_ids[i])].tolist(),
            )
            for i in range(n)
        ]
