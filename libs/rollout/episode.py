"""Episodes: the model's turns and the environment's replies between them, one rule for both sides.

A branch is the prompt, then every token after it: the model's sampled turns and, between them,
the environment's reply tokens. The worker plays episodes (`play`): it samples a turn for every
live branch in one backend call, asks the environment for its reply, appends the reply's tokens
and samples the next turn from there; a sampled turn's tokens are never decoded and encoded
again (tokens in, tokens out), only the reply is tokenized. The validator replays a claimed
branch (`replay_turns`): it calls the same `next_context` on the claimed turns and refuses the
branch unless every token the model did not sample is what the environment produces and the
episode ends exactly where the rule ends it. So a worker cannot forge a tool result, skip a
tool call, edit a reply, stop early or go on after the end; the sampled turns themselves are
checked by the seeded-sampling replay and the proof, which cover the whole branch.

A single-turn rollout is the one-turn case: `next_context` returns None after the first turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.libs.model.backend import FinishReason, Generation, GenerationBackend, SampleRow
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.tokenizer import decode, prompt_ids
from prime_swarm.protocol.messages import CompletionSample

from .admission import Refusal

MAX_COMPLETION_TOKENS = 4096
"""A branch's tokens after the prompt, at most (the protocol's cap on a completion)."""
_TURN = "\x00prime-swarm-assistant-turn\x00"
"""A stand-in assistant message: the chat template renders it, and the reply's text is what
the template writes after it."""


def reply_ids(tok: PreTrainedTokenizerBase, text: str, after_eos: int | None) -> list[int]:
    """The tokens of an environment reply, as the model reads it after its turn.

    Without a chat template: the text itself. With one: what the template writes after an
    assistant message, the reply as a user message, and the next assistant turn opened; the
    model's own EOS (`after_eos`, the turn's last token when it was one) already closed its
    message, so the template's copy of it is left out, and a turn cut at the length cap is
    closed by the template's. A template that rewrites earlier turns when a message is added
    has no such suffix: refused (ValueError) rather than silently re-tokenizing a turn.
    """
    if not tok.chat_template:
        return list(tok.encode(text, add_special_tokens=False))
    history = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN}]
    before = tok.apply_chat_template(history, tokenize=False)
    after = tok.apply_chat_template(
        [*history, {"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(before[: before.index(_TURN) + len(_TURN)]):
        raise ValueError("the chat template rewrites earlier turns: no reply suffix")
    suffix = after[before.index(_TURN) + len(_TURN) :]
    if after_eos is not None:
        closing = tok.decode([after_eos])
        if closing and suffix.startswith(closing):
            suffix = suffix[len(closing) :]
    return list(tok.encode(suffix, add_special_tokens=False))


@dataclass(frozen=True)
class Limits:
    """What bounds an episode besides the environment: tokens per turn and in all."""

    max_new_tokens: int
    budget: int
    """The most tokens after the prompt: the model's context less the prompt, and the
    protocol's cap."""

    @classmethod
    def of(cls, lm: CausalLM, prompt_len: int, max_new_tokens: int) -> Limits:
        return cls(max_new_tokens, min(lm.context_len - prompt_len, MAX_COMPLETION_TOKENS))


def next_context(
    env: Env,
    task: Task,
    tok: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    turns: Sequence[Sequence[int]],
    used: int,
    limits: Limits,
) -> list[int] | None:
    """The environment's tokens after the model's `turns` (`used` tokens after the prompt so
    far), or None when the episode is over: at the environment's turn limit, when it ends the
    episode, or when its reply and a whole next turn would not fit the budget."""
    if len(turns) >= env.max_turns:
        return None
    text = env.reply(task, [decode(tok, t) for t in turns])
    if text is None:
        return None
    last = turns[-1][-1] if turns[-1] and turns[-1][-1] in eos_ids else None
    ids = reply_ids(tok, text, last)
    if not ids or used + len(ids) + limits.max_new_tokens > limits.budget:
        return None
    return ids


# --------------------------------------------------------------------------- the worker's side
@dataclass
class Branch:
    """One completion of a group being played: the tokens after the prompt so far."""

    env: Env
    task: Task
    prompt: list[int]
    seed: int
    sample: int
    limits: Limits
    token_ids: list[int] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """The engine's log-prob of each sampled token; 0 at the environment's tokens."""
    finish_reason: FinishReason = "length"
    """How the last turn ended."""

    def row(self) -> SampleRow:
        return SampleRow(self.prompt + self.token_ids, self.seed, self.sample, len(self.token_ids))

    def turns(self) -> list[list[int]]:
        return [self.token_ids[a:b] for a, b in self.spans]

    def add_turn(self, g: Generation) -> None:
        start = len(self.token_ids)
        self.token_ids += g.token_ids
        self.logprobs += g.logprobs
        self.spans.append([start, len(self.token_ids)])
        self.finish_reason = g.finish_reason

    def add_context(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)


def play(
    backend: GenerationBackend,
    lm: CausalLM,
    branches: Sequence[Branch],
    *,
    max_new_tokens: int,
    temperature: float,
) -> None:
    """Play every branch to its end, turn by turn: one backend call per turn for all the
    branches still live (a batch is several times cheaper per completion than one at a time)."""
    live = list(branches)
    while live:
        generated = backend.generate_rows(
            lm, [b.row() for b in live], max_new_tokens=max_new_tokens, temperature=temperature
        )
        going = []
        for b, g in zip(live, generated, strict=True):
            b.add_turn(g)
            ids = next_context(
                b.env, b.task, lm.tokenizer, lm.eos_ids, b.turns(), len(b.token_ids), b.limits
            )
            if ids is not None:
                b.add_context(ids)
                going.append(b)
        live = going


# --------------------------------------------------------------------------- the validator's side
def turn_finish(turn: Sequence[int], eos_ids: frozenset[int], max_new_tokens: int) -> str | None:
    """How a sampled turn ended ("eos" or "length"), or None when it does not stop where honest
    decoding would: at its first EOS, or at the cap with none."""
    n_eos = sum(t in eos_ids for t in turn)
    if n_eos == 1 and turn and turn[-1] in eos_ids and len(turn) <= max_new_tokens:
        return "eos"
    if n_eos == 0 and len(turn) == max_new_tokens:
        return "length"
    return None


def replay_turns(
    env: Env,
    task: Task,
    tok: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    sample: CompletionSample,
    limits: Limits,
) -> list[str]:
    """The decoded model turns of a claimed branch, once the environment, run again on them,
    produces every token between them and ends the episode where the branch ends; a Refusal
    naming the first turn that does not."""
    ids, spans = sample.token_ids, sample.sampled_spans
    if len(ids) > limits.budget:
        raise Refusal("malformed", f"{len(ids)} tokens after the prompt exceed {limits.budget}")
    turns: list[list[int]] = []
    for k, (start, end) in enumerate(spans):
        turn = ids[start:end]
        finish = turn_finish(turn, eos_ids, limits.max_new_tokens)
        if finish is None:
            raise Refusal(
                "bad_termination",
                f"turn {k} does not stop at its first EOS or at "
                f"max_new_tokens={limits.max_new_tokens}",
            )
        turns.append(turn)
        try:
            expected = next_context(env, task, tok, eos_ids, turns, end, limits)
        except Exception as exc:  # plugin code on claimed turns: never crash the batch
            # The worker ran the same code on the same turns: an honest episode got through it.
            raise Refusal(
                "context_mismatch", f"the environment fails on turn {k}: {type(exc).__name__}"
            ) from exc
        last = k == len(spans) - 1
        if last and expected is not None:
            raise Refusal("bad_termination", f"the episode was cut short after turn {k}")
        if last and finish != sample.finish_reason:
            raise Refusal("bad_termination", f"the last turn ends by {finish}")
        claimed = ids[end : spans[k + 1][0]] if not last else ids[end:]
        if claimed != (expected or []):
            raise Refusal(
                "context_mismatch",
                f"the tokens after turn {k} are not the environment's reply "
                f"({len(claimed)} claimed, {len(expected or [])} expected)",
            )
    return [decode(tok, t) for t in turns]


def termination_ok(
    turn: Sequence[int], finish_reason: str, eos_ids: frozenset[int], max_new_tokens: int
) -> bool:
    """Does a turn stop where honest decoding would, and the way it says it did?"""
    return turn_finish(turn, eos_ids, max_new_tokens) == finish_reason


def play_tasks(
    backend: GenerationBackend,
    lm: CausalLM,
    env: Env,
    tasks: Sequence[Task],
    seeds: Sequence[int],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
) -> list[list[float]]:
    """`group_size` episodes per task, played as one batch; each group's scores, in order."""
    groups = []
    for task, seed in zip(tasks, seeds, strict=True):
        prompt = prompt_ids(lm.tokenizer, task.prompt)
        limits = Limits.of(lm, len(prompt), max_new_tokens)
        groups.append([Branch(env, task, prompt, seed, j, limits) for j in range(group_size)])
    play(
        backend,
        lm,
        [b for g in groups for b in g],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    tok = lm.tokenizer
    return [[env.score(b.task, [decode(tok, t) for t in b.turns()]) for b in g] for g in groups]
