"""Character-level tokenizer for the tiny model, built with the `tokenizers` library.

One token per character keeps the RL tasks readable (a reversed string is a reversed token
sequence) and makes `tokenizer.json` loadable by any Hugging Face tooling.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

# Ordered so ids are stable across builds: specials first, then the printable alphabet.
ALPHABET = string.digits + string.ascii_lowercase + string.ascii_uppercase + " =+-*/:;,.?!()<>_#'\""

TOKENIZER_FILE = "tokenizer.json"


def build_tokenizer() -> Tokenizer:
    """Fixed character vocabulary: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then ALPHABET."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # WordLevel maps whole pre-tokens, so split into single characters (spaces included).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens without the spaces WordLevel's default decoding would insert.
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))


def special_id(tok: Tokenizer, token: str) -> int:
    idx = tok.token_to_id(token)
    if idx is None:
        raise KeyError(f"tokenizer has no special token {token!r}")
    return idx


def encode(tok: Tokenizer, text: str, *, add_bos: bool = False) -> list[int]:
    ids = tok.encode(text, add_special_tokens=False).ids
    return [special_id(tok, BOS), *ids] if add_bos else ids


def decode(tok: Tokenizer, ids: list[int]) -> str:
    """Text of `ids` with special tokens (pad, bos, eos) dropped."""
    return tok.decode(list(ids), skip_special_tokens=True)
