"""Episodes on the real (tiny, untrained) model: the worker plays turns through the hf backend,
the validator replays the environment on the claimed turns; every way of tampering with the
tokens between turns, or with where the episode ends, is refused with its reason."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from echo_env import TURNS, EchoCount

from prime_swarm.libs.environments.base import Env, Task
from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hf_backend import HFBackend
from prime_swarm.libs.model.tokenizer import build_tokenizer, prompt_ids
from prime_swarm.libs.rollout.admission import Refusal
from prime_swarm.libs.rollout.episode import Branch, Limits, play, replay_turns, reply_ids
from prime_swarm.protocol.messages import CompletionSample

MAX_NEW, GROUP = 4, 4


class Flaky(EchoCount):
    """The same, but its reply changes from one call to the next: not a function of its input."""

    def __init__(self) -> None:
        self.calls = 0

    def reply(self, task: Task, turns: Sequence[str]) -> str | None:
        self.calls += 1
        return f"<{self.calls}>"


@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return CausalLM(init_tiny_model(1), build_tokenizer())


def played(lm: CausalLM, env: Env, seed: int = 7) -> list[Branch]:
    task = env.task_from_id("echo-count/train/0")
    prompt = prompt_ids(lm.tokenizer, task.prompt)
    limits = Limits.of(lm, len(prompt), MAX_NEW)
    branches = [Branch(env, task, prompt, seed, j, limits) for j in range(GROUP)]
    play(HFBackend("fp32"), lm, branches, max_new_tokens=MAX_NEW, temperature=1.0)
    return branches


def sample(b: Branch, **update: object) -> CompletionSample:
    fields = {
        "token_ids": b.token_ids,
        "sampled_spans": b.spans,
        "finish_reason": b.finish_reason,
        "proof": b"x",
        **update,
    }
    return CompletionSample.model_validate(fields)


def replayed(lm: CausalLM, env: Env, b: Branch, **update: object) -> list[str]:
    return replay_turns(env, b.task, lm.tokenizer, lm.eos_ids, sample(b, **update), b.limits)


def test_branches_alternate_sampled_turns_and_environment_replies(lm: CausalLM) -> None:
    env = EchoCount()
    for b in played(lm, env):
        assert len(b.spans) == TURNS
        turns = replayed(lm, env, b)
        assert turns == [lm.tokenizer.decode(t, skip_special_tokens=True) for t in b.turns()]
        # Between turns: exactly the environment's reply, tokenized alone.
        for k in range(TURNS - 1):
            reply = f"<{k + 1}:{len(turns[k])}>"
            between = b.token_ids[b.spans[k][1] : b.spans[k + 1][0]]
            assert between == reply_ids(lm.tokenizer, reply, None)
        assert all(lp == 0.0 for k, lp in enumerate(b.logprobs) if not in_spans(k, b.spans))


def in_spans(k: int, spans: list[list[int]]) -> bool:
    return any(a <= k < b for a, b in spans)


def test_later_turns_continue_the_noise_positions(lm: CausalLM) -> None:
    """Turn 2 of a branch samples with the noise of its absolute completion positions: the
    same tokens as a one-row call that starts at that offset, not as a fresh turn at 0."""
    b = played(lm, EchoCount())[0]
    start = b.spans[1][0]
    from prime_swarm.libs.model.backend import SampleRow

    row = SampleRow(b.prompt + b.token_ids[:start], b.seed, b.sample, start)
    (again,) = HFBackend("fp32").generate_rows(lm, [row], max_new_tokens=MAX_NEW, temperature=1.0)
    assert again.token_ids == b.token_ids[b.spans[1][0] : b.spans[1][1]]
    at_zero = SampleRow(row.context, b.seed, b.sample, 0)
    (fresh,) = HFBackend("fp32").generate_rows(
        lm, [at_zero], max_new_tokens=MAX_NEW, temperature=1.0
    )
    assert fresh.token_ids != again.token_ids


def test_a_forged_reply_is_refused(lm: CausalLM) -> None:
    b = played(lm, EchoCount())[0]
    ids = list(b.token_ids)
    at = b.spans[0][1]  # the first reply token
    ids[at] = lm.tokenizer.encode("9", add_special_tokens=False)[0]
    with pytest.raises(Refusal) as err:
        replayed(lm, EchoCount(), b, token_ids=ids)
    assert err.value.reason == "context_mismatch" and "after turn 0" in err.value.detail


def test_a_skipped_reply_is_refused(lm: CausalLM) -> None:
    """The environment's reply left out: the next turn follows the previous one directly."""
    b = played(lm, EchoCount())[0]
    (a0, e0), (a1, e1) = b.spans[0], b.spans[1]
    ids = b.token_ids[:e0] + b.token_ids[a1:e1]
    spans = [[a0, e0], [e0, e0 + e1 - a1]]
    # Spans must be apart: a turn right after a turn is malformed before any replay.
    with pytest.raises(ValueError, match="in order with context tokens between"):
        sample(b, token_ids=ids, sampled_spans=spans, finish_reason="length")


def test_a_branch_cut_short_is_refused(lm: CausalLM) -> None:
    b = played(lm, EchoCount())[0]
    end = b.spans[1][1]
    last = b.token_ids[b.spans[1][0] : end]
    finish = "eos" if last[-1] in lm.eos_ids else "length"
    with pytest.raises(Refusal) as err:
        replayed(
            lm,
            EchoCount(),
            b,
            token_ids=b.token_ids[:end],
            sampled_spans=b.spans[:2],
            finish_reason=finish,
        )
    assert err.value.reason == "bad_termination" and "cut short after turn 1" in err.value.detail


def test_a_branch_that_goes_on_after_the_end_is_refused(lm: CausalLM) -> None:
    b = played(lm, EchoCount())[0]
    extra = reply_ids(lm.tokenizer, "<3:0>", None)
    with pytest.raises(Refusal) as err:
        replayed(lm, EchoCount(), b, token_ids=b.token_ids + extra)
    assert err.value.reason == "context_mismatch"


def test_a_turn_past_its_first_eos_is_bad_termination(lm: CausalLM) -> None:
    b = played(lm, EchoCount())[0]
    eos = min(lm.eos_ids)
    a, e = b.spans[0]
    ids = b.token_ids[:a] + [eos, eos] + b.token_ids[e:]
    spans = [[a, a + 2]] + [[s + 2 - (e - a), t + 2 - (e - a)] for s, t in b.spans[1:]]
    with pytest.raises(Refusal) as err:
        replayed(lm, EchoCount(), b, token_ids=ids, sampled_spans=spans)
    assert err.value.reason == "bad_termination" and "turn 0" in err.value.detail


def test_a_non_deterministic_environment_is_caught(lm: CausalLM) -> None:
    """An environment whose replies are not a function of the task and the turns: the
    validator's replay disagrees with the worker's honest episode, and says where."""
    b = played(lm, Flaky())[0]
    with pytest.raises(Refusal) as err:
        replayed(lm, Flaky(), b)  # a fresh instance: its first reply is "<1>" again, but
    assert err.value.reason == "context_mismatch"  # the worker's second one was "<2>"


def test_a_single_turn_rollout_is_the_one_turn_case(lm: CausalLM) -> None:
    class OneTurn(EchoCount):
        max_turns = 1

    env = OneTurn()
    for b in played(lm, env):
        assert b.spans == [[0, len(b.token_ids)]]
        s = sample(b, sampled_spans=[])
        assert s.sampled_spans == [[0, len(b.token_ids)]]
        assert replay_turns(env, b.task, lm.tokenizer, lm.eos_ids, s, b.limits)


def test_chat_template_replies_close_and_reopen_turns() -> None:
    """With a chat template, a reply is the template's text after an assistant message: the
    user message and the opened assistant turn, without repeating the model's own EOS."""
    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|bos|>{{ m.role }}\n{{ m.content }}<|eos|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
    )
    eos = tok.convert_tokens_to_ids("<|eos|>")
    after_eos = tok.decode(reply_ids(tok, "hi", eos))
    assert after_eos == "\n<|bos|>user\nhi<|eos|>\n<|bos|>assistant\n"
    after_cap = tok.decode(reply_ids(tok, "hi", None))
    assert after_cap == "<|eos|>\n<|bos|>user\nhi<|eos|>\n<|bos|>assistant\n"


def test_an_environment_that_raises_on_claimed_turns_is_a_refusal_not_a_crash(lm: CausalLM) -> None:
    class Picky(EchoCount):
        def reply(self, task: Task, turns: Sequence[str]) -> str | None:
            if turns[-1] == "bad":
                raise KeyError("no such move")
            return super().reply(task, turns)

    b = played(lm, Picky())[0]
    claimed = [*lm.tokenizer.encode("bad", add_special_tokens=False), min(lm.eos_ids)]
    with pytest.raises(Refusal) as err:
        replayed(lm, Picky(), b, token_ids=claimed, sampled_spans=[], finish_reason="eos")
    assert err.value.reason == "context_mismatch"
    assert "fails on turn 0: KeyError" in err.value.detail
