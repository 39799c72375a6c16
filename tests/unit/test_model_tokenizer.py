from prime_swarm.libs.model.tokenizer import (
    BOS,
    EOS,
    PAD,
    build_tokenizer,
    decode,
    encode,
    load_tokenizer,
)


def test_special_ids_are_fixed():
    tok = build_tokenizer()
    assert [tok.token_to_id(t) for t in (PAD, BOS, EOS)] == [0, 1, 2]


def test_round_trip_one_token_per_char():
    tok = build_tokenizer()
    text = "rev 0123 abc XYZ=+-?!"
    ids = encode(tok, text)
    assert len(ids) == len(text)
    assert decode(tok, ids) == text


def test_decode_drops_specials_and_bos_is_prepended():
    tok = build_tokenizer()
    ids = encode(tok, "42", add_bos=True)
    assert ids[0] == tok.token_to_id(BOS)
    assert decode(tok, [*ids, tok.token_to_id(EOS), tok.token_to_id(PAD)]) == "42"


def test_saved_tokenizer_loads_identically(tmp_path):
    tok = build_tokenizer()
    tok.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tmp_path)
    assert again.get_vocab() == tok.get_vocab()
    assert encode(again, "rev 987=") == encode(tok, "rev 987=")
