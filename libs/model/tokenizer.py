"""Tokenizers: the tiny model's byte-level BPE, and the one prompt-encoding rule for any model.

`prompt_ids` is the rule the worker, the validator (which refuses a submission whose prompt
tokens differ from it) and the trainer's evaluation all share: a model with a chat template sees
its prompt as chat messages rendered by that template, with the assistant turn opened; a model
without one sees the raw text, as it was trained.

The tiny tokenizer is byte-level BPE with no merges: the 256-byte alphabet plus three special
tokens. transformers 5 loads a `qwen2` tokenizer as byte-level BPE whatever `tokenizer_class`
says, so a byte-level vocabulary is the one that round-trips through `AutoTokenizer`; with no
merges every digit is its own token, which keeps the reversal task a token-level reversal.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from prime_swarm.protocol.messages import ChatMessage, Prompt

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE: ids 0-255 are the bytes (in ByteLevel's alphabet order), then pad, bos,
    eos. A pure function of this code: the same ids on every machine."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([PAD, BOS, EOS])
    # unk is EOS (never produced: every byte has a token) so that transformers, which loads a
    # qwen2 directory as Qwen2Tokenizer, does not add its default unk `<|endoftext|>` as a 260th
    # token the 259-row embedding cannot hold.
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=EOS
    )


def chat_messages(prompt: Prompt) -> list[ChatMessage]:
    """A prompt as chat messages: raw text is one user message."""
    if isinstance(prompt, str):
        return [ChatMessage(role="user", content=prompt)]
    return [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in prompt]


def prompt_ids(tok: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """The prompt's token ids, as worker, validator and trainer must all compute them.

    With a chat template: the messages rendered by it (`add_generation_prompt=True`), then
    tokenized with no further special tokens (the template writes its own). Without one: the
    raw text (chat messages' contents joined by blank lines) under the tokenizer's own
    special-token rule; a tokenizer that defines a BOS token but does not add it (Qwen2's adds
    none) gets it prepended, so a prompt never starts mid-context.
    """
    if tok.chat_template:
        messages = [m.model_dump() for m in chat_messages(prompt)]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
    else:
        text = (
            prompt
            if isinstance(prompt, str)
            else "\n\n".join(m.content for m in chat_messages(prompt))
        )
        ids = list(tok(text, add_special_tokens=True)["input_ids"])
        bos = tok.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def decode(tok: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Text of `ids` with special tokens (pad, bos, eos) dropped."""
    return tok.decode(list(ids), skip_special_tokens=True)
