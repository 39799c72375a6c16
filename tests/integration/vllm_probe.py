"""Run by test_vllm_backend.py in its own process: a vLLM engine pins torch's thread settings for
the whole process, which must not leak into the rest of the suite. Prints one JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(tmp: Path) -> dict:
    import torch

    from prime_swarm.libs.model.backend import SampleRow
    from prime_swarm.libs.model.build import build_tiny_model
    from prime_swarm.libs.model.hf_backend import HFBackend
    from prime_swarm.libs.model.io import load_pretrained
    from prime_swarm.libs.model.logprobs import token_logprobs
    from prime_swarm.libs.model.vllm_backend import _CHOICES, VLLMBackend, VLLMBackendError
    from prime_swarm.libs.rollout.recompute import prefill_hidden

    a = load_pretrained(build_tiny_model(0, tmp / "a"))
    b = load_pretrained(build_tiny_model(1, tmp / "b"))
    prompts = [[257, *range(65 + i, 70 + i)] for i in range(3)]
    seeds = [101, 202, 303]
    backend = VLLMBackend("bf16")
    kw = {"group_size": 4, "max_new_tokens": 12, "temperature": 1.0}
    out: dict = {}
    together = backend.generate(a, prompts, seeds, **kw)
    alone = [backend.generate(a, [p], [s], **kw)[0] for p, s in zip(prompts, seeds, strict=True)]
    out["batch_invariant"] = all(
        x.token_ids == y.token_ids
        for g, h in zip(together, alone, strict=True)
        for x, y in zip(g, h, strict=True)
    )
    hf = HFBackend("bf16").generate(a, prompts, seeds, **kw)
    out["same_tokens_as_hf"] = sum(
        x.token_ids == y.token_ids
        for g, h in zip(together, hf, strict=True)
        for x, y in zip(g, h, strict=True)
    )
    # A later turn continues a branch: its noise is keyed from the row's offset on, by both
    # engines alike, and a row at offset 0 is a different draw.
    rows = [
        SampleRow([*p, 66, 67], s, j, 7)
        for p, s in zip(prompts, seeds, strict=True)
        for j in (0, 1)
    ]
    at_offset = backend.generate_rows(a, rows, max_new_tokens=12, temperature=1.0)
    hf_offset = HFBackend("bf16").generate_rows(a, rows, max_new_tokens=12, temperature=1.0)
    out["offset_rows"] = len(rows)
    out["offset_same_tokens_as_hf"] = sum(
        x.token_ids == y.token_ids for x, y in zip(at_offset, hf_offset, strict=True)
    )
    at_zero = backend.generate_rows(
        a,
        [SampleRow(r.context, r.seed, r.sample) for r in rows],
        max_new_tokens=12,
        temperature=1.0,
    )
    out["offset_changes_draw"] = sum(
        x.token_ids != y.token_ids for x, y in zip(at_offset, at_zero, strict=True)
    )
    out["completions"] = sum(len(g) for g in together)
    flat = [c for g in together for c in g]
    out["finish_reasons_ok"] = all(
        (c.finish_reason == "eos") == (c.token_ids[-1] in a.eos_ids) for c in flat
    )
    out["logprobs_ok"] = all(
        len(c.logprobs) == len(c.token_ids) and all(lp <= 0.0 for lp in c.logprobs) for c in flat
    )
    # vLLM's own log-probs (its processor's, over vLLM's logits) against the log-probs of the
    # proof prefill's states under the pool's fp32 head.
    again = prefill_hidden(a, [(prompts[0], c.token_ids) for c in together[0]], "bf16")
    head = a.cast("bf16")
    out["max_logprob_diff_vs_prefill"] = max(
        float(
            (
                torch.tensor(x.logprobs)
                - token_logprobs(head.head_logits(y), torch.tensor(x.token_ids), 1.0)
            )
            .abs()
            .max()
        )
        for x, y in zip(together[0], again, strict=True)
    )
    # The seeded choice reproduces against the validator's logits (replay gaps) and proofs pass.
    out["replay_gap_max"], out["pooled_err"] = _judge(a, prompts, seeds, together, kw)
    # A new policy version loads in place; the engine then follows the new weights.
    on_b = backend.generate(b, prompts, seeds, **kw)
    out["reloaded_differs"] = any(
        x.token_ids != y.token_ids
        for g, h in zip(together, on_b, strict=True)
        for x, y in zip(g, h, strict=True)
    )
    out["b_replay_gap_max"], _ = _judge(b, prompts, seeds, on_b, kw)
    out["a_vs_b_replay_gap_max"], _ = _judge(a, prompts, seeds, on_b, kw)
    # A vLLM that bypasses the processor is refused, never turned into a submission.
    real_take = _CHOICES.take
    _CHOICES.take = lambda key: {}  # type: ignore[method-assign]
    try:
        backend.generate(a, prompts[:1], seeds[:1], **kw)
        out["bypass_detected"] = False
    except VLLMBackendError:
        out["bypass_detected"] = True
    finally:
        _CHOICES.take = real_take  # type: ignore[method-assign]
    return out


def _judge(lm, prompts, seeds, groups, kw) -> tuple[float, float]:  # noqa: ANN001
    from prime_swarm.libs.rollout.calibration import acceptance_for
    from prime_swarm.libs.rollout.recompute import prefill_hidden
    from prime_swarm.libs.rollout.verify import replay_gaps
    from prime_swarm.libs.toploc import (
        build_proofs_batch,
        group_contexts,
        pooled_mant_err_mean,
        verify_proofs_batch,
    )

    acc = acceptance_for("vllm")
    gap, pooled = 0.0, 0.0
    head = lm.cast("bf16")
    for p, s, g in zip(prompts, seeds, groups, strict=True):
        hid = prefill_hidden(lm, [(p, c.token_ids) for c in g], "bf16")
        for j, (c, h) in enumerate(zip(g, hid, strict=True)):
            gaps = replay_gaps(head.head_logits(h), c.token_ids, kw["temperature"], s, j)
            gap = max(gap, float(gaps.max()))
        ctx = group_contexts("ab" * 32, f"lease-{s}", [c.token_ids for c in g])
        # The worker proves over its own proof prefill (libs/rollout/answer.py).
        proofs = build_proofs_batch(prefill_hidden(lm, [(p, c.token_ids) for c in g], "bf16"), ctx)
        res = verify_proofs_batch(hid, proofs, ctx, acc.gross)
        pooled = max(pooled, pooled_mant_err_mean(res))
    return gap, pooled


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
