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


# --------------------------------------------------------------------------- pool numerics
# A pool announces one inference precision; workers must generate in it and validators recompute
# in it. The TOPLOC proof commits to the bf16 bit patterns of the final hidden states, and a bf16
# forward leaves a fingerprint that an fp32 or fp16 forward cannot reproduce: every intermediate
# is rounded to bf16, so the recomputed top-k values match the committed ones bit for bit on
# almost every point, while a forward at another precision matches only about a third of them.
# The sampling head always runs in fp32 over the (rounded) hidden states, so logits, Gumbel replay
# and log-probs are deterministic functions of the committed hidden states.

PRECISIONS: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
_CAST_CACHE: dict[tuple[int, torch.dtype], tuple[object, TinyGPT]] = {}


def cast_for_inference(model: TinyGPT, precision: str) -> TinyGPT:
    """``model`` with weights and activations in ``precision`` (a cached copy when it differs)."""
    import copy
    import weakref

    dtype = PRECISIONS[precision]
    if next(model.parameters()).dtype == dtype:
        return model
    key = (id(model), dtype)
    hit = _CAST_CACHE.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    cast = copy.deepcopy(model).to(dtype).eval()
    ref = weakref.ref(model, lambda _r, k=key: _CAST_CACHE.pop(k, None))
    _CAST_CACHE[key] = (ref, cast)
    return cast


def head_logits(model: TinyGPT, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits from final hidden states (the pool's sampling head)."""
    head = model.lm_head
    bias = head.bias.float() if head.bias is not None else None
    return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)


@dataclass
class CapturedCompletion(Completion):
    """A completion with the final hidden states captured while it was generated ([L, C])."""

    hidden: torch.Tensor | None = None


@torch.no_grad()
def generate_captured(
    model: TinyGPT,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
    precision: str = "bf16",
) -> list[list[CapturedCompletion]]:
    """Like `generate_batch`, at the pool's precision, keeping each step's final hidden state.

    Every forward runs on the canonical layout (see `canonical_forward`): sequences left-aligned
    in a buffer as wide as the model's context, so each row's arithmetic is the same whatever
    else shares the batch and however long the completion has grown; a validator's prefill on
    the same layout reproduces the hidden state behind token k bit for bit. That hidden state is
    the one TOPLOC commits to: no second prefill is needed.
    """
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    model = cast_for_inference(model, precision)
    rows = [(p, s, j) for p, s in zip(prompts, seeds, strict=True) for j in range(group_size)]
    n = len(rows)
    device = next(model.parameters()).device
    lens = torch.tensor([len(r[0]) for r in rows], device=device)
    if n == 0:
        return [[] for _ in prompts]
    if int(lens.min()) == 0:
        raise ValueError("every prompt needs at least one token (the BOS)")
    width = model.config.block_size
    if int(lens.max()) + max_new_tokens > width:
        raise ValueError(f"prompt + {max_new_tokens} new tokens exceed the context of {width}")
    pad = model.config.pad_token_id
    ids = torch.full((n, width), pad, dtype=torch.long, device=device)
    attn = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, : len(r[0])] = torch.as_tensor(list(r[0]), dtype=torch.long)
        attn[i, : len(r[0])] = 1
    vocab = model.config.vocab_size
    hidden_dim = model.config.n_embd
    hid = torch.zeros((n, max_new_tokens, hidden_dim), dtype=torch.bfloat16, device=device)
    out: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    cur = lens.clone()
    for pos in range(max_new_tokens):
        live = [i for i in range(n) if not done[i]]
        live_t = torch.tensor(live, device=device)
        _, hidden = model(ids[live_t], attention_mask=attn[live_t])
        last = hidden[torch.arange(len(live), device=device), cur[live_t] - 1]
        hid[live_t, pos] = last.to(torch.bfloat16)
        logits = head_logits(model, last)
        if temperature > 0:
            noise = torch.stack([gumbel_noise(rows[i][1], rows[i][2], pos, vocab) for i in live])
            scores = perturbed_scores(logits, temperature, noise.to(device))
        else:
            scores = logits
        chosen = scores.argmax(dim=-1)
        chosen_lp = token_logprobs(logits, chosen, temperature)
        ids[live_t, cur[live_t]] = chosen
        attn[live_t, cur[live_t]] = 1
        cur[live_t] += 1
        for i, tok, lp in zip(live, chosen.tolist(), chosen_lp.tolist(), strict=True):
            out[i].append(tok)
            lps[i].append(lp)
            done[i] = tok == eos_id
        if all(done):
            break
    comps = [
        CapturedCompletion(
            out[i], "eos" if done[i] else "length", lps[i], hidden=hid[i, : len(out[i])].cpu()
        )
        for i in range(n)
    ]
    return [comps[p * group_size : (p + 1) * group_size] for p in range(len(prompts))]


def canonical_forward(model: TinyGPT, sequences: Sequence[PromptCompletion]) -> torch.Tensor:
    """Completion-aligned final hidden states ([N, L, C]) from one forward on the canonical
    layout: right-padded to the model's full context (``block_size``), whatever the batch holds.

    Measured on CPU (bench/toploc_bench.py): bf16 rows come out bit-identical across batch sizes,
    batch compositions and thread counts, while the same rows padded to the batch's own width
    differ by an ulp here and there (the attention reduction is blocked by width).
    """
    width = model.config.block_size
    device = next(model.parameters()).device
    n = len(sequences)
    ids = torch.full((n, width), model.config.pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    for i, (p, c) in enumerate(sequences):
        row = [*p, *c]
        if not p or len(row) > width:
            raise ValueError(f"sequence {i}: needs a prompt and at most {width} tokens")
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        attn[i, : len(row)] = 1
    _, hidden = model(ids.to(device), attention_mask=attn.to(device))
    n_comp = max(len(c) for _, c in sequences)
    k = torch.arange(n_comp, device=device)
    start = torch.tensor([len(p) - 1 for p, _ in sequences], device=device)
    src = (start[:, None] + k[None, :]).clamp(max=width - 1)
    return hidden.gather(1, src[:, :, None].expand(-1, -1, hidden.shape[-1]))


@torch.no_grad()
def prefill_at(
    model: TinyGPT, sequences: Sequence[PromptCompletion], precision: str = "bf16"
) -> list[PrefillOutput]:
    """`prefill` at the pool's precision: bf16 hidden states, fp32 head logits over them."""
    if not sequences:
        return []
    model = cast_for_inference(model, precision)
    hidden = canonical_forward(model, sequences).to(torch.bfloat16)
    logits = head_logits(model, hidden)
    return [
        PrefillOutput(logits[i, : len(c)], hidden[i, : len(c)])
        for i, (_, c) in enumerate(sequences)
    ]


__all__ += [
    "PRECISIONS",
    "CapturedCompletion",
    "canonical_forward",
    "cast_for_inference",
    "generate_captured",
    "head_logits",
    "prefill_at",
]
