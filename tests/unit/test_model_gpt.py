import torch

from prime_swarm.libs.model.build import init_tiny_model
from prime_swarm.libs.rl.forward import pad_left, pad_right


def _model():
    return init_tiny_model(0).eval()


def test_hidden_is_what_lm_head_consumes():
    m = _model()
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        logits, hidden = m(ids)
        assert torch.allclose(m.lm_head(hidden), logits)
    assert hidden.shape == (1, 5, m.config.n_embd)
    assert logits.shape == (1, 5, m.config.vocab_size)


def test_left_and_right_padding_match_unpadded():
    m = _model()
    seqs = [[1, 5, 6, 7, 8, 9, 10], [1, 11, 12], [1, 13, 14, 15, 16]]
    with torch.no_grad():
        single = [m(torch.tensor([s]))[0][0] for s in seqs]
        for pad in (pad_left, pad_right):
            ids, mask = pad(seqs, m.config.pad_token_id)
            logits, _ = m(ids, attention_mask=mask)
            assert torch.isfinite(logits).all()
            for i, expected in enumerate(single):
                rows = mask[i].bool()
                assert torch.allclose(logits[i][rows], expected, atol=1e-5)


def test_full_mask_equals_no_mask():
    m = _model()
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    with torch.no_grad():
        a = m(ids)[0]
        b = m(ids, attention_mask=torch.ones_like(ids))[0]
    assert torch.allclose(a, b, atol=1e-6)


def test_same_seed_same_weights():
    a, b, c = init_tiny_model(3), init_tiny_model(3), init_tiny_model(4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.wte.weight, c.wte.weight)
