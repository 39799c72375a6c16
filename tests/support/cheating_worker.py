"""A worker that cheats one way: the real `prime-worker` CLI, with what it sends rewritten.

    python tests/support/cheating_worker.py KIND join --pool N ...   (the worker's own flags)

Submission cheats rewrite each batch before the client signs and sends it, so the orchestrator
sees a correctly signed request from a staked worker; weight cheats generate with other weights
than the leased policy's. The kinds follow the TOPLOC benches' attack suite
(bench/toploc/cheats.py). It lives with the test helpers because tests/unit/test_cheating_worker.py
checks each cheat as well as `make hostile` running them (bench/hostile).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

import torch

from prime_swarm.libs.policy.store import LoadedPolicy, PolicyStore
from prime_swarm.protocol.messages import RolloutSubmission, SubmissionBatch
from prime_swarm.services.worker import cli
from prime_swarm.services.worker.client import OrchestratorClient

rng = random.Random(0)
Rewrite = Callable[[RolloutSubmission], RolloutSubmission]


def tampered_token(sub: RolloutSubmission) -> RolloutSubmission:
    i = rng.randrange(len(sub.completions))
    comps = list(sub.completions)
    toks = list(comps[i].token_ids)
    pos = rng.randrange(len(toks))
    toks[pos] = (toks[pos] + 1 + rng.randrange(5)) % 64
    comps[i] = comps[i].model_copy(update={"token_ids": toks})
    return sub.model_copy(update={"completions": comps})


def truncated(sub: RolloutSubmission) -> RolloutSubmission:
    comps = list(sub.completions)
    i = max(range(len(comps)), key=lambda k: len(comps[k].token_ids))
    toks = comps[i].token_ids
    cut = toks[: max(1, len(toks) // 2)] if len(toks) > 1 else toks
    update: dict[str, object] = {"token_ids": cut, "finish_reason": "eos"}
    if comps[i].logprobs is not None:
        update["logprobs"] = comps[i].logprobs[: len(cut)]
    comps[i] = comps[i].model_copy(update=update)
    return sub.model_copy(update={"completions": comps})


def inflated_reward(sub: RolloutSubmission) -> RolloutSubmission:
    comps = [c.model_copy(update={"claimed_reward": (c.claimed_reward or 0.0) + 0.5})
             for c in sub.completions]  # fmt: skip
    return sub.model_copy(update={"completions": comps})


def forged_proof(sub: RolloutSubmission) -> RolloutSubmission:
    comps = [c.model_copy(update={"proof": bytes(rng.randrange(256) for _ in range(len(c.proof)))})
             for c in sub.completions]  # fmt: skip
    return sub.model_copy(update={"completions": comps})


def tampered_prompt(sub: RolloutSubmission) -> RolloutSubmission:
    ids = list(sub.prompt_token_ids)
    ids[rng.randrange(len(ids))] = (ids[0] + 7) % 64
    return sub.model_copy(update={"prompt_token_ids": ids})


SUBMISSION_CHEATS: dict[str, Rewrite] = {
    "tampered_completion_token": tampered_token,
    "truncated_completion": truncated,
    "inflated_reward": inflated_reward,
    "forged_proof": forged_proof,
    "tampered_prompt": tampered_prompt,
}


# Weight cheats: generate with the leased policy's weights changed in place after each load.
def neighbour(w: torch.Tensor) -> torch.Tensor:
    """A 1 %-RMS fine-tuned neighbour of the policy."""
    return w + 0.01 * w.pow(2).mean().sqrt() * torch.randn_like(w)


def other_model(w: torch.Tensor) -> torch.Tensor:
    """Another model altogether: weights of the same scale, drawn afresh."""
    return torch.randn_like(w) * w.std().clamp_min(1e-3)


WEIGHT_CHEATS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "finetuned_neighbour_1pct_rms": neighbour,
    "different_model_other_seed": other_model,
}
KINDS = [*SUBMISSION_CHEATS, *WEIGHT_CHEATS, "replayed_submission"]


def install(kind: str) -> None:
    send = OrchestratorClient.submit_batch
    if kind in SUBMISSION_CHEATS:
        rewrite = SUBMISSION_CHEATS[kind]

        def cheat(self: OrchestratorClient, batch: SubmissionBatch):  # type: ignore[no-untyped-def]
            subs = [rewrite(s) for s in batch.submissions]
            return send(self, batch.model_copy(update={"submissions": subs}))

        OrchestratorClient.submit_batch = cheat  # type: ignore[method-assign]
    elif kind == "replayed_submission":
        stash: list[RolloutSubmission] = []

        def replay(self: OrchestratorClient, batch: SubmissionBatch):  # type: ignore[no-untyped-def]
            # The first generation ever made is claimed again for every later lease (its prompt
            # and completions under their lease ids): one genuine submission, then only replays.
            if not stash:
                stash.append(batch.submissions[0])
            first = stash[0]
            same = {"prompt_token_ids": first.prompt_token_ids, "completions": first.completions}
            subs = [s if s is first else s.model_copy(update=same) for s in batch.submissions]
            return send(self, batch.model_copy(update={"submissions": subs}))

        OrchestratorClient.submit_batch = replay  # type: ignore[method-assign]
    elif kind in WEIGHT_CHEATS:
        perturb, get = WEIGHT_CHEATS[kind], PolicyStore.get

        def load(self: PolicyStore, *args: object, **kwargs: object) -> LoadedPolicy:
            policy = get(self, *args, **kwargs)  # type: ignore[arg-type]
            with torch.no_grad():
                for p in policy.lm.module.parameters():
                    p.copy_(perturb(p.float()).to(p.dtype))
            return policy

        PolicyStore.get = load  # type: ignore[method-assign]
    else:
        raise SystemExit(f"cheating_worker: unknown kind {kind!r}; one of {', '.join(KINDS)}")


if __name__ == "__main__":
    install(sys.argv[1])
    cli.main(sys.argv[2:])
