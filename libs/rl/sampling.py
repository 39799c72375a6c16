"""Replayable sampling: seeded Gumbel-max decoding, batched prefill and the validator's replay.

A worker samples token k of sample i as argmax(logits / T + g) with Gumbel noise g derived only
from (lease seed, i, k). A validator recomputes the logits, regenerates g and checks that each
submitted token is (within float tolerance) the argmax, so a worker cannot choose its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import torch

from prime_swarm.libs.model.gpt import TinyGPT
from prime_swarm.libs.rl.forward import PromptCompletion, forward_completions, pad_left
from prime_swarm.libs.rl.logprobs import scale_logits, token_logprobs

_U64 = (1 << 64) - 1


def gumbel_noise(seed: int, sample_index: int, position: int, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [vocab_size] (float32), a pure function of its arguments.

    `sample_index` is the completion's index in its group, `position` the token's index in the
    completion (0 = first generated token); `seed` comes from the lease.

    Philox is counter-based: key = seed, counter = (draw, position, sample_index), so any
    (sample, position) is addressable directly, and its raw 64-bit outputs are the same on every
    platform and numpy version. The uint64 -> (0, 1) map is done here, not by numpy, to stay
    exactly specified.
    """
    if not 0 <= seed < 1 << 128:
        raise ValueError("seed must be in [0, 2**128)")
    key = np.array([seed & _U64, seed >> 64], dtype=np.uint64)
    counter = np.array([0, position, sample_index, 0], dtype=np.uint64)
    raw = np.random.Philox(key=key, counter=counter).random_raw(vocab_size)
    u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # strictly in (0, 1)
    return torch.from_numpy(-np.log(-np.log(u))).float()


def perturbed_scores(logits: torch.Tensor, temperature: float, noise: torch.Tensor) -> torch.Tensor:
    if temperature <= 0:
        return logits.float()
    return logits.float() / temperature + noise


def sample_next(logits: torch.Tensor, temperature: float, noise: torch.Tensor) -> int:
    """argmax(logits / T + noise); greedy argmax when T == 0. Ties go to the lowest id."""
    return int(torch.argmax(perturbed_scores(logits, temperature, noise)))


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: Literal["eos", "length"]
    # log softmax(logits / T) of each sampled token, as the generating machine computed it.
    logprobs: list[float] = field(default_factory=list)


@torch.no_grad()
def generate_batch(
    model: TinyGPT,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
) -> list[list[Completion]]:
    """Sample `group_size` completions for every prompt in one left-padded batch.

    Completion j of prompt p uses (seeds[p], sample_index=j), exactly as `generate` would.
    There is no KV cache: sequences are a few dozen tokens, and re-running the prefix keeps
    decoding as simple to audit as the validator's replay.
    """
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    rows = [(p, s, j) for p, s in zip(prompts, seeds, strict=True) for j in range(group_size)]
    device = next(model.parameters()).device
    ids, attn = pad_left([r[0] for r in rows], model.config.pad_token_id)
    ids, attn = ids.to(device), attn.to(device)
    n = len(rows)
    out: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    vocab = model.config.vocab_size
    for pos in range(max_new_tokens):
        logits = model(ids, attention_mask=attn)[0][:, -1, :].float()
        live = [i for i in range(n) if not done[i]]
        if temperature > 0:
            noise = torch.stack([gumbel_noise(rows[i][1], rows[i][2], pos, vocab) for i in live])
            scores = perturbed_scores(logits[live], temperature, noise.to(device))
        else:
            scores = logits[live]
        chosen = scores.argmax(dim=-1)
        chosen_lp = token_logprobs(logits[live], chosen, temperature)
        nxt = torch.full((n,), model.config.pad_token_id, dtype=torch.long, device=device)
        nxt[live] = chosen
        for i, tok, lp in zip(live, chosen.tolist(), chosen_lp.tolist(), strict=True):
            out[i].append(tok)
            lps[i].append(lp)
            done[i] = tok == eos_id
        if all(done):
            break
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=device)], dim=1)
    comps = [Completion(out[i], "eos" if done[i] else "length", lps[i]) for i in range(n)]
    return [comps[p * group_size : (p + 1) * group_size] for p in range(len(prompts))]


def generate(
    model: TinyGPT,
    prompt_ids: Sequence[int],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    eos_id: int,
) -> list[Completion]:
    """A group of `group_size` completions of one prompt, sample i replayable from (seed, i)."""
    return generate_batch(
        model,
        [prompt_ids],
        [seed],
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        eos_id=eos_id,
    )[0]


class PrefillOutput(NamedTuple):
    logits: torch.Tensor  # [L, V]: row k is the distribution that predicted completion token k
    hidden: torch.Tensor  # [L, C]: the final hidden state lm_head turned into logits[k]


@torch.no_grad()
def prefill(model: TinyGPT, sequences: Sequence[PromptCompletion]) -> list[PrefillOutput]:
    """Recompute, in ONE padded forward, the logits and hidden states behind every completion token.

    Row k belongs to the position holding the token before completion token k (the last prompt
    token for k = 0), i.e. the decode step that produced token k: that is what a worker captures
    for TOPLOC and what a validator replays sampling from.
    """
    if not sequences:
        return []
    logits, hidden, _, _ = forward_completions(model, sequences)
    return [
        PrefillOutput(logits[i, : len(c)].float(), hidden[i, : len(c)])
        for i, (_, c) in enumerate(sequences)
    ]


def replay_check(
    logits: torch.Tensor,
    token_ids: Sequence[int],
    temperature: float,
    seed: int,
    sample_index: int,
    tol: float = 1e-3,
) -> tuple[bool, int | None]:
    """Was every token the Gumbel-max choice? Returns (ok, first bad position or None).

    A token passes when its perturbed score is within `tol` of the best one, which absorbs the
    float noise between the worker's and the validator's hardware without letting a worker pick
    a token that was not (nearly) the argmax.
    """
    if logits.shape[0] != len(token_ids):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(token_ids)} tokens")
    logits = logits.detach().float().cpu()
    vocab = logits.shape[-1]
    for pos, tok in enumerate(token_ids):
        if not 0 <= tok < vocab:
            return False, pos
        noise = gumbel_noise(seed, sample_index, pos, vocab) if temperature > 0 else None
        scores = perturbed_scores(logits[pos], temperature, noise)
        if float(scores.max() - scores[tok]) > tol:
            return False, pos
    return True, None


def termination_ok(
    token_ids: Sequence[int], finish_reason: str, eos_id: int, max_new_tokens: int
) -> bool:
    """Does the completion stop where honest decoding would: at its first EOS, or at the cap?"""
    n_eos = sum(t == eos_id for t in token_ids)
    if finish_reason == "eos":
        return n_eos == 1 and token_ids[-1] == eos_id and len(token_ids) <= max_new_tokens
    if finish_reason == "length":
        return n_eos == 0 and len(token_ids) == max_new_tokens
    return False


def completion_logprobs(
    prefilled: PrefillOutput, token_ids: Sequence[int], temperature: float
) -> list[float]:
    """The behaviour-policy log-probs a validator attaches for the trainer."""
    tokens = torch.tensor(list(token_ids), device=prefilled.logits.device)
    return token_logprobs(prefilled.logits, tokens, temperature).tolist()


__all__ = [
    "Completion",
    "PrefillOutput",
    "completion_logprobs",
    "generate",
    "generate_batch",
    "gumbel_noise",
    "prefill",
    "replay_check",
    "sample_next",
    "scale_logits",
    "termination_ok",
]
