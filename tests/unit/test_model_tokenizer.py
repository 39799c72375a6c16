"""The tiny model's byte-level BPE tokenizer and the one prompt-encoding rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.model.io import save_pretrained
from prime_swarm.libs.model.tokenizer import BOS, EOS, PAD, build_tokenizer, decode, prompt_ids
from prime_swarm.protocol.messages import ChatMessage

TEXTS = [
    "rev 0123 abc XYZ=+-?!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "héllo wörld, naïve café",
    "漢字かな交じり文",
    "emoji 🙂🚀 and a ZWJ 👩‍💻",
    "\x00\x01\x7f control bytes",
    "",
]


def _ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_special_ids_are_fixed_after_the_256_bytes() -> None:
    tok = build_tokenizer()
    assert len(tok) == 259
    assert tok.convert_tokens_to_ids([PAD, BOS, EOS]) == [256, 257, 258]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (256, 257, 258)
    # A pure function of the code: a second build assigns every id identically.
    assert build_tokenizer().get_vocab() == tok.get_vocab()


def test_the_first_256_ids_are_the_byte_alphabet() -> None:
    tok = build_tokenizer()
    vocab = tok.get_vocab()
    assert sorted(v for k, v in vocab.items() if k not in (PAD, BOS, EOS)) == list(range(256))
    # Every ASCII byte on its own is exactly one of those ids, each a different one.
    ascii_ids = [_ids(tok, chr(b)) for b in range(128)]
    assert all(len(i) == 1 and i[0] < 256 for i in ascii_ids)
    assert len({i[0] for i in ascii_ids}) == 128


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_one_token_per_utf8_byte(text: str) -> None:
    tok = build_tokenizer()
    ids = _ids(tok, text)
    # No merges: a token per byte, whatever the script, so nothing is ever out of vocabulary.
    assert len(ids) == len(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert decode(tok, ids) == text


def test_every_digit_is_its_own_token() -> None:
    tok = build_tokenizer()
    digits = [_ids(tok, str(d)) for d in range(10)]
    assert all(len(d) == 1 for d in digits)
    assert len({d[0] for d in digits}) == 10
    # Runs of digits never merge: reversing the text reverses the tokens (the reversal task).
    number = "9081726354"
    assert _ids(tok, number) == [digits[int(c)][0] for c in number]
    assert _ids(tok, number[::-1]) == _ids(tok, number)[::-1]


def test_decode_drops_special_tokens() -> None:
    tok = build_tokenizer()
    ids = prompt_ids(tok, "42")
    assert decode(tok, [*ids, tok.eos_token_id, tok.pad_token_id, tok.pad_token_id]) == "42"


@pytest.mark.parametrize("text", ["rev 4821=", "x", " "])
def test_prompt_ids_prepends_bos_exactly_once(text: str) -> None:
    tok = build_tokenizer()
    ids = prompt_ids(tok, text)
    assert ids == [tok.bos_token_id, *_ids(tok, text)]
    assert ids.count(tok.bos_token_id) == 1


def test_prompt_ids_does_not_double_a_bos_the_tokenizer_adds_itself() -> None:
    tok = build_tokenizer()
    # Tokenizers such as Llama's add BOS in their post-processor: no second one may be added.
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tok.bos_token_id)]
    )
    assert tok("7", add_special_tokens=True)["input_ids"][0] == tok.bos_token_id
    ids = prompt_ids(tok, "rev 7=")
    assert ids == [tok.bos_token_id, *_ids(tok, "rev 7=")]
    assert ids.count(tok.bos_token_id) == 1


def test_empty_prompt_is_just_bos() -> None:
    tok = build_tokenizer()
    assert prompt_ids(tok, "") == [tok.bos_token_id]


def _assert_same_tokenizer(again: PreTrainedTokenizerBase, tok: PreTrainedTokenizerBase) -> None:
    assert again.get_vocab() == tok.get_vocab()
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id) == (256, 257, 258)
    for text in TEXTS:
        assert _ids(again, text) == _ids(tok, text)
        assert prompt_ids(again, text) == prompt_ids(tok, text)
        assert decode(again, prompt_ids(again, text) + [again.eos_token_id]) == text


def test_saved_tokenizer_loads_identically_with_auto_tokenizer(tmp_path: Path) -> None:
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    _assert_same_tokenizer(AutoTokenizer.from_pretrained(tmp_path / "tok"), tok)


@pytest.fixture(scope="module")
def model_dir_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    # Inside a model directory the qwen2 config is present too, and AutoTokenizer picks the
    # tokenizer class from it: this is the tokenizer workers and validators actually load.
    out = save_pretrained(init_tiny_model(0), build_tokenizer(), tmp_path_factory.mktemp("m") / "m")
    return AutoTokenizer.from_pretrained(out, local_files_only=True)


def test_model_directory_tokenizer_encodes_identically(
    model_dir_tokenizer: PreTrainedTokenizerBase,
) -> None:
    tok, again = build_tokenizer(), model_dir_tokenizer
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id) == (256, 257, 258)
    for text in TEXTS:
        assert _ids(again, text) == _ids(tok, text)
        assert prompt_ids(again, text) == prompt_ids(tok, text)
        assert decode(again, prompt_ids(again, text) + [again.eos_token_id]) == text


def test_model_directory_tokenizer_has_exactly_the_built_vocabulary(
    model_dir_tokenizer: PreTrainedTokenizerBase,
) -> None:
    # Any id the tokenizer can produce must be one the model can embed.
    assert model_dir_tokenizer.get_vocab() == build_tokenizer().get_vocab()
    assert len(model_dir_tokenizer) == init_tiny_model(0).config.vocab_size


# A ChatML-like template, as instruct models ship them (SmolLM2's is this shape with a default
# system prompt): the rendered text carries its own special tokens.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


def test_a_chat_template_renders_the_prompt_as_messages() -> None:
    tok = build_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    bos, eos = tok.convert_tokens_to_ids([BOS, EOS])
    ids = prompt_ids(tok, "12+7=")  # raw text is one user message
    assert ids[0] == bos and ids.count(bos) == 2 and ids.count(eos) == 1
    assert tok.decode(ids) == "<|bos|>user\n12+7=<|eos|>\n<|bos|>assistant\n"
    messages = [
        ChatMessage(role="system", content="Answer with a number."),
        ChatMessage(role="user", content="12+7="),
    ]
    chat = prompt_ids(tok, messages)
    assert tok.decode(chat).startswith("<|bos|>system\nAnswer with a number.<|eos|>\n<|bos|>user")
    # Plain dicts, as a plugin may write them, encode the same.
    assert prompt_ids(tok, [m.model_dump() for m in messages]) == chat


def test_without_a_chat_template_messages_are_their_raw_text() -> None:
    tok = build_tokenizer()
    assert tok.chat_template is None
    messages = [ChatMessage(role="user", content="rev 321=")]
    assert prompt_ids(tok, messages) == prompt_ids(tok, "rev 321=")
    two = [ChatMessage(role="system", content="a"), ChatMessage(role="user", content="b")]
    assert prompt_ids(tok, two) == prompt_ids(tok, "a\n\nb")
