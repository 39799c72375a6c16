"""A worker's answer to a lease: its episodes played through the injected backend (one turn or
many, libs/rollout/episode.py), then the one proof prefill of each branch
(libs/rollout/recompute.prefill_hidden) and the TOPLOC proofs over it, built off the critical
path in a background thread, and the submission."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from prime_swarm.libs.environments import load_env
from prime_swarm.libs.model.backend import GenerationBackend
from prime_swarm.libs.model.causal_lm import CausalLM
from prime_swarm.libs.model.hardware import device_class
from prime_swarm.libs.model.tokenizer import decode, prompt_ids
from prime_swarm.libs.policy.store import LoadedPolicy
from prime_swarm.libs.toploc import ProofContext, build_proofs_batch, group_contexts
from prime_swarm.protocol.messages import CompletionSample, Lease, RolloutSubmission

from .episode import Branch, Limits, play
from .recompute import prefill_hidden


@dataclass
class ProofTimer:
    """Seconds spent generating and building proofs (for the overhead figure)."""

    generate_s: float = 0.0
    prove_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, gen: float = 0.0, prove: float = 0.0) -> None:
        with self.lock:
            self.generate_s += gen
            self.prove_s += prove


class ProofBuilder:
    """One background thread that turns captured hidden states into proofs, so the next
    generation starts while the previous group's proofs are still being built."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toploc-prover")
        self.timer = ProofTimer()

    def submit(
        self,
        lm: CausalLM,
        precision: str,
        pairs: list[tuple[list[int], list[int]]],
        contexts: list[ProofContext],
    ) -> Future[list[bytes]]:
        def job() -> list[bytes]:
            t0 = time.perf_counter()
            # One prefill of every chosen sequence, the same one a validator recomputes.
            hiddens = prefill_hidden(lm, pairs, precision)
            proofs = build_proofs_batch(hiddens, contexts)
            self.timer.add(prove=time.perf_counter() - t0)
            return proofs

        return self._pool.submit(job)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass
class PendingSubmission:
    """A generated group whose proofs are being built; `result()` blocks until they are."""

    lease: Lease
    policy_version: int
    backend: str
    precision: str
    device_class: str
    prompt_ids: list[int]
    completions: list[Branch]
    rewards: list[float]
    proofs: Future[list[bytes]]
    """The proofs of the whole batch this group was generated in; `span` is this group's."""
    span: slice

    def result(self) -> RolloutSubmission:
        proofs = self.proofs.result()[self.span]
        samples = [
            CompletionSample(
                token_ids=c.token_ids,
                sampled_spans=c.spans,
                finish_reason=c.finish_reason,
                proof=proof,
                claimed_reward=reward,
                logprobs=c.logprobs,
            )
            for c, proof, reward in zip(self.completions, proofs, self.rewards, strict=True)
        ]
        lease = self.lease
        return RolloutSubmission(
            lease_id=lease.lease_id,
            worker=lease.worker,
            pool_id=lease.pool_id,
            task_id=lease.task_id,
            policy_version=self.policy_version,
            backend=self.backend,  # type: ignore[arg-type]
            precision=self.precision,  # type: ignore[arg-type]
            device_class=self.device_class,
            prompt_token_ids=self.prompt_ids,
            completions=samples,
        )


def start_leases(
    policy: LoadedPolicy, leases: Sequence[Lease], backend: GenerationBackend, builder: ProofBuilder
) -> list[PendingSubmission]:
    """Play every lease's episodes now, one backend call per turn and sampling setting (a batch
    of 8 prompts costs about a fifth per completion of 8 single-prompt calls on CPU); hand the
    proofs to the background builder and return at once."""
    tok = policy.lm.tokenizer
    device = device_class(str(policy.lm.device))
    by_sampling: dict[tuple[int, int, float], list[Lease]] = defaultdict(list)
    for lease in leases:
        s = lease.sampling
        by_sampling[(lease.group_size, s.max_new_tokens, s.temperature)].append(lease)
    out: dict[str, PendingSubmission] = {}
    for (group_size, max_new_tokens, temperature), batch in by_sampling.items():
        prompts = [prompt_ids(tok, lease.prompt) for lease in batch]
        groups: list[list[Branch]] = []
        for lease, prompt in zip(batch, prompts, strict=True):
            env = load_env(lease.env, lease.env_args)
            task = env.task_from_id(lease.task_id)
            limits = Limits.of(policy.lm, len(prompt), max_new_tokens)
            groups.append(
                [Branch(env, task, prompt, lease.seed, j, limits) for j in range(group_size)]
            )
        t0 = time.perf_counter()
        play(
            backend,
            policy.lm,
            [b for g in groups for b in g],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        builder.timer.add(gen=time.perf_counter() - t0)
        # One proof job for the whole batch: the field arithmetic runs once over every chunk.
        # A proof covers every token after the prompt, the environment's too: one prefill per
        # branch, whatever its turns.
        pairs: list[tuple[list[int], list[int]]] = []
        contexts: list[ProofContext] = []
        spans: list[slice] = []
        for lease, prompt, branches in zip(batch, prompts, groups, strict=True):
            spans.append(slice(len(pairs), len(pairs) + len(branches)))
            pairs.extend((prompt, b.token_ids) for b in branches)
            contexts.extend(
                group_contexts(policy.model_hash, lease.lease_id, [b.token_ids for b in branches])
            )
        future = builder.submit(policy.lm, backend.precision, pairs, contexts)
        for lease, prompt, branches, span in zip(batch, prompts, groups, spans, strict=True):
            rewards = [b.env.score(b.task, [decode(tok, t) for t in b.turns()]) for b in branches]
            out[lease.lease_id] = PendingSubmission(
                lease,
                policy.version,
                backend.name,
                backend.precision,
                device,
                prompt,
                branches,
                rewards,
                future,
                span,
            )
    return [out[lease.lease_id] for lease in leases]


def start_lease(
    policy: LoadedPolicy, lease: Lease, backend: GenerationBackend, builder: ProofBuilder
) -> PendingSubmission:
    return start_leases(policy, [lease], backend, builder)[0]
