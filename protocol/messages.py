"""Every message that crosses a process boundary.

The same models travel as JSON over HTTP (worker <-> orchestrator, trainer -> origin) and as the
`data` field of Redis stream entries (orchestrator -> validator -> trainer). A service never
defines its own copy of one of these: that is how a field rename stays a one-line change.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    model_validator,
)

PROTOCOL_VERSION = 2
"""2: a TOPLOC proof commits to the prefill that forwards the prompt once and each completion on
its cached keys (libs/rollout/recompute.prefill_hidden); a version-1 worker's proofs would fail
a same-class validator's bit-exact check, so it is refused at the door (422), never slashed."""

ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"

Address = Annotated[
    str,
    Field(pattern=ADDRESS_PATTERN, description="Hex address, EIP-55 or not; read as lower case"),
    AfterValidator(str.lower),
]
"""An account address in the one form the pool compares, keys and stores: a model field of this
type holds it in lower case whatever case was sent, so no reader lowers it again. EIP-55 is for
people and web3, which libs/chain/client.py checksums on its own."""

AddressAsWritten = Annotated[
    str, Field(pattern=ADDRESS_PATTERN, description="Hex address, kept as written")
]
"""An address kept in the case it came in: where the exact text matters, as in a signed
manifest (its signature covers the trainer's address as the trainer wrote it) or an EIP-55
address shown to people. Compare it through `normal_address`."""

_ADDRESS = TypeAdapter(Address)


def normal_address(value: str) -> str:
    """`value` in the form an `Address` field holds, for addresses that do not come in through a
    model (a recovered signer, a key's own address, a chain event, a header). Raises
    ValueError (pydantic's ValidationError) for anything that is not an address."""
    return _ADDRESS.validate_python(value)


def _decode_b64(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise ValueError(f"invalid base64: {exc}") from exc


# Proof bytes ride inside JSON, so they are base64 on the wire and bytes in memory.
B64Bytes = Annotated[
    bytes,
    PlainValidator(_decode_b64),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str),
]


class Message(BaseModel):
    """Base for wire messages: unknown fields are refused so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Versioned(Message):
    protocol_version: Literal[2] = Field(
        default=PROTOCOL_VERSION, description="Wire protocol version; bumped on breaking changes."
    )


# ---------------------------------------------------------------- policy distribution


class ShardInfo(Message):
    index: int = Field(ge=0)
    offset: int = Field(ge=0, description="Byte offset of the shard in the file.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class FileEntry(Message):
    """One file of a policy version (the weights, or a small config/tokenizer file)."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,128}$", description="Plain file name, no path.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    shards: list[ShardInfo]


class FileDelta(Message):
    """A cheaper way to one file of a version: the parent version's file plus a delta
    (libs/shardcast/delta.py). Relays carry the delta like any file; a client holding the
    parent's file fetches it, rebuilds the file and checks it against the file's signed hash."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,128}$", description="The file it rebuilds.")
    parent_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the parent's file it applies to."
    )
    delta: FileEntry = Field(description="The delta's own bytes, sharded and hashed.")


class Manifest(Versioned):
    """What the trainer signs for each policy version; integrity never depends on relays."""

    version: int = Field(ge=0)
    parent_version: int | None = Field(default=None, ge=0)
    shard_size: int = Field(gt=0)
    files: list[FileEntry]
    deltas: list[FileDelta] = Field(
        default_factory=list,
        description="Files of this version also offered as deltas against `parent_version`.",
    )
    model_hash: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 over the sorted (name, sha256) of files."
    )
    created_at: float = Field(default_factory=time.time)
    # As written: the signature covers the manifest's JSON, which must read back byte for byte.
    trainer: AddressAsWritten


class SignedManifest(Versioned):
    manifest: Manifest
    signature: str = Field(description="EIP-191 signature by `manifest.trainer` over the JSON.")


class RelayVersions(Versioned):
    """Relay/origin -> anyone: `GET /v1/versions`, the complete versions it can serve."""

    versions: list[int] = Field(description="Complete versions held, oldest first.")
    latest: int | None = Field(description="Newest complete version, None when empty.")


class PolicyAnnouncement(Versioned):
    """Trainer -> `policy:announcements`: version `version` is on the origin and may be used."""

    version: int = Field(ge=0)
    step: int = Field(ge=0, description="Trainer optimizer steps completed when published.")
    model_hash: str
    manifest_path: str = Field(description="Path of the signed manifest on any relay.")
    announced_at: float = Field(default_factory=time.time)


class PolicyInfo(Message):
    """What a worker needs to fetch and use the current policy."""

    version: int
    model_hash: str
    manifest_path: str
    relays: list[str] = Field(description="Base URLs of relays serving the policy.")
    min_version: int = Field(description="Oldest version whose rollouts are still admitted.")
    # No trainer address here: it is a trust anchor, read from the pool record on chain (or a
    # pinned flag), never from the orchestrator that could otherwise feed workers forged weights.


# ---------------------------------------------------------------- worker <-> orchestrator


BackendName = Literal["hf", "vllm"]
"""Generation engines a worker may run; the validator's limits are calibrated per engine."""
Precision = Literal["bf16", "fp16", "fp32"]
"""Compute precisions a worker may generate in; the validator recomputes in the declared one."""


# Text a worker chooses and operators read (status page, CLI): bounded, no control characters,
# so it can neither flood a page nor smuggle terminal escapes into a log or a status line.
ShortText = Annotated[str, Field(max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]


class WorkerClaim(BaseModel):
    """Whom a signed worker request is for: the `worker` and `pool_id` that each of them
    carries (RegisterRequest, Heartbeat, LeaseRequest, RolloutSubmission, SubmissionBatch).
    Read on its own, the rest of the body ignored, so that the orchestrator identifies the
    caller before the whole body is validated."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    worker: Address
    pool_id: int = Field(ge=1)


VersionText = Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9.+!_-]*$")]


class EnvRelease(Message):
    """One environment as a machine has it installed: another release answers otherwise."""

    env: str = Field(max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    version: VersionText = Field(description="Its distribution's version.")
    content_hash: str = Field(
        max_length=64,
        pattern=r"^[0-9a-f]*$",
        description="sha256 of the source of the module that defines it (first 16 hex digits).",
    )


class WorkerStack(Message):
    """What a worker's numbers and environment tokens depend on, declared at registration: the
    pool accepts the stacks its recipe names (`Recipe.stacks`), and validators key their limits
    on the device class. Self-reported; what it claims is checked where it can be (the device
    class's numbers by the proofs, the environments' by the replays)."""

    python: VersionText
    torch: VersionText
    transformers: VersionText
    vllm: VersionText = ""
    backend: BackendName
    precision: Precision
    device_class: str = Field(max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    environments: list[EnvRelease] = Field(default_factory=list, max_length=32)


class AcceptedStacks(Message):
    """The stacks a pool accepts: version specifiers (PEP 440), empty for any. Pinned here, in
    the recipe, once: what verification was calibrated on (docs/contributing-compute.md)."""

    python: str = Field(">=3.11,<3.14", max_length=128)
    # 2.13 and 2.14 are the releases bench/results/stacks.json judged honest work of (2.14.1 on
    # Python 3.13, from PyPI): a release nobody has measured is refused until someone has.
    torch: str = Field(">=2.13,<2.15", max_length=128)
    transformers: str = Field(">=5.0,<6", max_length=128)
    vllm: str = Field("==0.32.*", max_length=128)
    env_releases: dict[str, VersionText] = Field(
        default_factory=dict,
        max_length=32,
        description="Environment -> the one version of its distribution the pool accepts; an "
        "environment not named here must match the orchestrator's own release.",
    )


class PoolRequirements(Versioned):
    """`GET /v1/requirements`: what a machine must run to work for this pool, read before
    anything is staked."""

    pool_id: int
    stacks: AcceptedStacks
    environments: list[EnvRelease] = Field(default_factory=list, max_length=32)
    tool_python: str | None = Field(default=None, pattern=r"^3\.\d{1,2}$")


class RegisterRequest(Versioned):
    worker: Address
    pool_id: int = Field(ge=1)
    backend: BackendName = "hf"
    device: str = Field(default="cpu", max_length=64)
    hardware: ShortText = Field(
        default="",
        description="What the worker runs on, as it describes itself (e.g. 'NVIDIA H100 80GB, "
        "CUDA 12.8'); shown on the pool's status page. Self-reported, never trusted.",
    )
    stack: WorkerStack | None = Field(
        default=None,
        description="What its work depends on; a pool refuses a stack its recipe does not accept "
        "(None: a worker from before stacks were declared, accepted as before).",
    )


EnvArgs = Annotated[
    dict[str, JsonValue],
    Field(
        max_length=64,
        description="The environment's arguments, as the pool's recipe sets them "
        "(PRIME_RECIPE_ENV_ARGS); worker and validator build the environment from them.",
    ),
]


class PoolEnvironment(Message):
    """One environment the pool leases tasks from (of a mixture, or the only one)."""

    env: str
    env_args: EnvArgs = Field(default_factory=dict)
    weight: float = Field(default=1.0, gt=0, le=1e6)


class RegisterReply(Versioned):
    worker: Address
    pool_id: int
    heartbeat_interval_s: float
    policy: PolicyInfo | None
    environments: list[PoolEnvironment] = Field(
        default_factory=list,
        max_length=32,
        description="The pool's environments: a worker that cannot build one says so at start.",
    )
    tool_python: str | None = Field(
        default=None,
        pattern=r"^3\.\d{1,2}$",
        description="The Python minor version the pool's sandboxed code runs under (None: the "
        "pool runs none); a worker whose sandbox interpreter is another refuses at start.",
    )


class Heartbeat(Versioned):
    # Unknown fields are dropped, not refused: workers from before the heartbeat lost its unread
    # `policy_version` and `rollouts_in_flight` still send them, and refusing those would answer
    # every heartbeat of an older worker with a 422. BodyGuard still caps size and nesting.
    model_config = ConfigDict(extra="ignore", frozen=True)

    worker: Address
    pool_id: int = Field(ge=1)


class HeartbeatReply(Versioned):
    policy: PolicyInfo | None


class SamplingParams(Message):
    temperature: float = Field(gt=0, le=4)
    max_new_tokens: int = Field(gt=0, le=4096)


class LeaseRequest(Versioned):
    worker: Address
    pool_id: int = Field(ge=1)
    policy_version: int = Field(ge=0, description="Version the worker will generate with.")
    count: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Leases wanted at once: a worker generates them as one batch, which is "
        "several times cheaper per completion than one prompt at a time.",
    )


class ChatMessage(Message):
    """One message of a chat-formatted prompt, rendered by the model's own chat template."""

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=65_536)


# What an environment asks the model: raw text, or chat messages for the model's chat template
# (libs/model/tokenizer.prompt_ids is the one rule that turns either into tokens).
Prompt = str | Annotated[list[ChatMessage], Field(min_length=1, max_length=64)]


class Lease(Versioned):
    """An assigned task: the worker may not choose its prompt (DESIGN.md §3.5)."""

    lease_id: str
    worker: Address
    pool_id: int
    work_id: int = Field(
        ge=0,
        lt=2**128,
        description="The orchestrator's sequence number of this worker's leases: the item's "
        "name on the ledger, where consecutive ids share one storage slot.",
    )
    env: str
    env_args: EnvArgs = Field(default_factory=dict)
    task_id: str
    prompt: Prompt
    group_size: int = Field(gt=0, le=64)
    sampling: SamplingParams
    seed: int = Field(ge=0, lt=2**63)
    min_policy_version: int = Field(ge=0)
    expires_at: float
    target_tokens: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Thinking budget named in the prompt; the length reward scores against it.",
    )
    format_reward: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="The recipe's weight of the environment's format score in the reward.",
    )


class LeaseReply(Versioned):
    leases: list[Lease] = Field(
        default_factory=list,
        max_length=64,
        description="Up to `count` leases; empty while no policy is published or the pool has "
        "enough work in flight (retry after `retry_after_s`).",
    )
    policy: PolicyInfo | None = Field(
        default=None, description="The current policy, so a worker sees a new version at once."
    )
    retry_after_s: float = 0.0


LogProb = Annotated[float, Field(allow_inf_nan=False, le=1e-3, ge=-1e4)]


Span = Annotated[list[int], Field(min_length=2, max_length=2)]
"""[start, end): a half-open range of positions in a completion's token ids."""


def check_spans(spans: list[list[int]], n_tokens: int) -> None:
    """Sampled spans must tile the completion's start: the first at 0, each non-empty, in order
    and apart (an environment's tokens sit between two), the last ending at or before the end.
    A ValueError names what is wrong."""
    if not spans or spans[0][0] != 0:
        raise ValueError("the first sampled span must start at position 0")
    previous_end = -1
    for start, end in spans:
        if not start < end <= n_tokens:
            raise ValueError(f"sampled span [{start}, {end}) is empty or past the end")
        if start <= previous_end:
            raise ValueError("sampled spans must be in order with context tokens between them")
        previous_end = end


def sampled_mask(spans: list[list[int]], n_tokens: int) -> list[bool]:
    """Per token of a completion: did the model sample it (or the environment write it)?"""
    mask = [False] * n_tokens
    for start, end in spans:
        end = min(end, n_tokens)  # never longer than the tokens, whatever the spans say
        mask[start:end] = [True] * max(end - start, 0)
    return mask


class CompletionSample(Message):
    """One branch of an episode: every token after the prompt, the model's sampled turns and the
    environment's replies between them, and which spans the model sampled (the rest is context
    the validator re-derives by running the environment again). A single-turn completion is one
    span over all of its tokens."""

    token_ids: list[int] = Field(max_length=4096)
    sampled_spans: list[Span] = Field(
        default_factory=list,
        max_length=64,
        description="[start, end) of each model turn in token_ids; empty means one turn that "
        "spans every token.",
    )
    finish_reason: Literal["eos", "length"] = Field(description="How the last turn ended.")
    proof: B64Bytes = Field(description="TOPLOC proof over the completion's hidden states.")
    claimed_reward: float | None = Field(
        default=None, description="Worker's own reward claim; validators recompute it."
    )
    logprobs: list[LogProb] | None = Field(
        default=None,
        max_length=4096,
        description="The engine's log-prob of each sampled token (tempered), as it sampled. "
        "Untrusted: the trainer uses it only through a truncated or masked importance weight.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_turn_by_default(cls, data: object) -> object:
        # Fill the single-turn span in before validation, so every reader sees explicit spans.
        if isinstance(data, dict) and not data.get("sampled_spans"):
            tokens = data.get("token_ids")
            if isinstance(tokens, list):
                return {**data, "sampled_spans": [[0, len(tokens)]]}
        return data

    @model_validator(mode="after")
    def _spans_and_logprobs(self) -> CompletionSample:
        check_spans(self.sampled_spans, len(self.token_ids))
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError("logprobs must have one entry per token (0 at context tokens)")
        return self


class RolloutSubmission(Versioned):
    """One lease answered: a group of completions sampled with the lease's seed."""

    lease_id: str
    worker: Address
    pool_id: int = Field(ge=1)
    task_id: str
    policy_version: int = Field(ge=0)
    backend: BackendName = Field(
        default="hf", description="Engine that generated it; selects the calibrated limits."
    )
    precision: Precision = Field(
        default="bf16",
        description="Precision it was computed in; the validator recomputes in the same one.",
    )
    device_class: str = Field(
        default="cpu",
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description="The kind of device it was computed on (`cpu-x86_64-avx2`, `cuda-sm90`): a "
        "suspect is settled by a second opinion recomputed on this class.",
    )
    prompt_token_ids: list[int] = Field(max_length=4096)
    completions: list[CompletionSample] = Field(min_length=1, max_length=64)

    def content_hash(self) -> str:
        """Identity of the work itself, independent of who submitted it: catches replays."""
        h = hashlib.sha256()
        h.update(self.task_id.encode())
        h.update(str(self.policy_version).encode())
        for c in self.completions:
            h.update(b"|" + ",".join(map(str, c.token_ids)).encode())
        return h.hexdigest()


class SubmitReply(Versioned):
    submission_id: str


class SubmissionBatch(Versioned):
    """Several answered leases in one signed request: one signature check, one standing check
    and one round trip for the lot (a worker generates its leases as one batch anyway)."""

    worker: Address
    pool_id: int = Field(ge=1)
    submissions: list[RolloutSubmission] = Field(min_length=1, max_length=64)


class SubmitResult(Message):
    """The fate of one submission of a batch: what `/v1/submit` would have answered."""

    lease_id: str
    status: int = Field(description="200 when admitted; otherwise the refusal's HTTP status.")
    submission_id: str | None = None
    reason: str | None = Field(default=None, description="Refusal code, as in error replies.")
    message: str = ""


class SubmitBatchReply(Versioned):
    results: list[SubmitResult]


class SubmittedRollout(Versioned):
    """Orchestrator -> `rollouts:submitted`: the submission plus the lease it answers."""

    submission_id: str
    lease: Lease
    submission: RolloutSubmission
    received_at: float = Field(default_factory=time.time)
    audit: bool = False
    """Set only by a validator, on `rollouts:held`: work it accepted (and attested) from a device
    class it is not, queued for a spot check by a validator of the declared class, which slashes
    a cheat and pays nothing twice. The orchestrator never sets it."""


# ---------------------------------------------------------------- validator -> trainer / chain

RejectReason = Literal[
    "lease_mismatch",
    "stale_policy",
    "unknown_policy",
    "bad_proof",
    "sampling_mismatch",
    "bad_termination",
    "context_mismatch",
    "reward_mismatch",
    "duplicate",
    "malformed",
    "held_for_recheck",
    # Refused on what an environment said, when the environment disagrees with itself: its bug,
    # not the worker's (libs/rollout/verify.py `environment_second_look`); never slashed.
    "env_nondeterministic",
    # Refused on what an environment said while it agrees with itself on the validator's
    # machine, before other workers' groups witness it replaying elsewhere: held, never slashed
    # until they do (libs/rollout/env_disputes.py).
    "env_unsettled",
    # The validator failed on a group that passed every input check (its own kernels, its
    # memory): its fault, never the worker's; refused, never slashed, and logged as an error.
    "validator_error",
]


class Verdict(Versioned):
    submission_id: str
    lease_id: str
    worker: Address
    pool_id: int
    accepted: bool
    reason: RejectReason | None = None
    detail: str = ""
    units: int = Field(ge=0, description="Work units credited on chain when accepted.")
    validator: Address
    decided_at: float = Field(default_factory=time.time)


class VerifiedCompletion(Message):
    token_ids: list[int]
    sampled_spans: list[Span] = Field(
        default_factory=list,
        description="The model's turns in token_ids (the loss covers these only); empty: all.",
    )
    logprobs: list[float] = Field(description="Behaviour-policy logprobs recomputed by validator.")
    inference_logprobs: list[float] | None = Field(
        default=None, description="The worker engine's own log-probs, for the mismatch weight."
    )
    reward: float = Field(
        description="task_reward + length_reward + format_reward, what the advantage uses."
    )
    task_reward: float = Field(description="The environment's score of the answer.")
    length_reward: float = Field(default=0.0, description="Thinking-budget part (<= 0 or so).")
    format_reward: float = Field(default=0.0, description="The recipe's weighted format part.")


class VerifiedRollout(Versioned):
    """Validator -> `rollouts:verified`: one group, ready for a GRPO step."""

    submission_id: str
    worker: Address
    env: str = Field(default="", description="The lease's environment (a mixture's reports).")
    task_id: str
    policy_version: int
    sampling: SamplingParams = Field(description="The lease's sampling, for the GRPO ratio.")
    prompt_token_ids: list[int]
    completions: list[VerifiedCompletion]
    verdict: Verdict
    submitted_at: float = Field(
        default_factory=time.time, description="When the orchestrator received it."
    )


# ---------------------------------------------------------------- trainer -> launcher / operators


class StepProgress(Message):
    """One line of the trainer's progress file, one per optimizer step."""

    step: int
    version: int
    mean_reward: float = Field(description="Mean total reward of the step's completions.")
    reward_task: float = Field(default=0.0, description="Mean task part of the reward.")
    reward_length: float = Field(default=0.0, description="Mean thinking-budget part.")
    reward_format: float = Field(default=0.0, description="Mean format part.")
    reward_by_env: dict[str, float] = Field(
        default_factory=dict, description="Mean task reward of this step's completions, by env."
    )
    groups_by_env: dict[str, int] = Field(
        default_factory=dict, description="This step's groups, by environment."
    )
    zero_advantage_by_env: dict[str, int] = Field(
        default_factory=dict,
        description="Groups so far whose completions all scored alike (trained or dropped).",
    )
    groups: int
    completions: int = Field(default=0, description="Completions in the step's batch.")
    policy_lag_mean: float = Field(description="Mean consumption lag (versions) of the batch.")
    policy_lag_max: int
    lag_histogram: dict[int, int] = Field(
        default_factory=dict, description="Consumption lag (versions) -> groups, this step."
    )
    rollout_age_s: float = Field(default=0.0, description="Mean seconds since submission.")
    stale_dropped: int
    filtered_total: int = Field(default=0, description="Zero-variance groups dropped so far.")
    accepted_total: int
    rejected_total: int
    loss: float
    clip_frac: float
    stats: dict[str, float] = Field(
        default_factory=dict,
        description="Loss statistics: clip fractions, ratio/importance weights, kl, entropy.",
    )
    seconds: float = Field(description="Compute time of the step.")
    idle_s: float = Field(default=0.0, description="Time the step waited for rollouts.")
    busy_fraction: float = Field(
        default=0.0, description="Compute share of wall time since the first step (warm-up)."
    )
    tokens_per_s: float = Field(default=0.0, description="Completion tokens per compute second.")
    wall: float


# ---------------------------------------------------------------- orchestrator status API
# Read-only and unsigned: what anyone may see of the pool (`GET /v1/status`, the status page).
# Worker-supplied text (addresses, hardware) is data here; a page renders it as text only.


class RelayHealth(Message):
    """One relay's answer to `GET /healthz`, as the orchestrator last saw it."""

    url: str
    healthy: bool = Field(description="Answered 200 with status 'ok' within the timeout.")
    status_code: int | None = Field(default=None, description="HTTP status; None: no answer.")
    latency_ms: float | None = Field(default=None, description="Round trip of the check.")
    latest_version: int | None = Field(
        default=None, description="Newest complete policy version the relay says it holds."
    )
    error: str = Field(default="", max_length=200, description="Why it is not healthy.")
    checked_at: float = Field(description="Unix time of the check.")


class RewardPoint(Message):
    """One trainer step's reward, from the trainer's progress stream."""

    step: int
    version: int
    mean_reward: float
    reward_task: float = 0.0
    reward_length: float = 0.0
    at: float = Field(description="Unix time the trainer recorded the step.")


class WorkerStatus(Message):
    """One worker as the pool sees it: counts come from the role that learns each fact (leases
    and submissions: the orchestrator; verdicts and units: the validators)."""

    worker: AddressAsWritten = Field(description="EIP-55, for people to read and copy.")
    hardware: str = Field(default="", description="Self-reported at registration; untrusted.")
    backend: str = ""
    device: str = ""
    registered: bool = Field(description="On the orchestrator's roster (may lease work).")
    live: bool = Field(description="Heard from (heartbeat, lease) within the heartbeat TTL.")
    ejected: bool = Field(description="Ejected on chain for silence and not registered since.")
    last_seen: float | None = Field(default=None, description="Unix time last heard from.")
    leases: int = Field(default=0, ge=0, description="Leases handed to it.")
    submitted: int = Field(default=0, ge=0, description="Submissions admitted to validation.")
    accepted: int = Field(default=0, ge=0, description="Submissions validators accepted.")
    rejected: dict[str, int] = Field(
        default_factory=dict, description="Submissions validators rejected, by reason."
    )
    why: dict[str, str] = Field(
        default_factory=dict,
        description="Each reason it was refused or held for, with the last such verdict's "
        "detail: the statistic that decided and its limit.",
    )
    ejection: str = Field(default="", description="Why it was ejected on chain, if it was.")
    units: int = Field(default=0, ge=0, description="Work units credited for attestation.")
    submitted_per_min: float = Field(
        default=0.0, ge=0, description="Submissions per minute over the throughput window."
    )
    accepted_per_min: float = Field(
        default=0.0, ge=0, description="Accepted submissions per minute over the window."
    )


class PoolStatus(Versioned):
    """`GET /v1/status`: the pool at a glance."""

    pool_id: int
    generated_at: float = Field(description="Unix time this answer was assembled.")
    policy_version: int | None = Field(description="Latest announced version; None before any.")
    trainer_step: int | None
    min_version: int | None = Field(description="Oldest version whose rollouts are admitted.")
    async_level: int
    workers_registered: int
    workers_live: int
    in_flight_groups: int = Field(description="Groups leased but not yet trained.")
    throughput_window_s: float = Field(description="Window of the per-minute rates.")
    relays: list[RelayHealth]
    rewards: list[RewardPoint] = Field(description="Recent trainer steps, oldest first.")
    workers: list[WorkerStatus] = Field(description="Registered workers, last seen first.")
    workers_truncated: bool = Field(description="More workers exist than this list holds.")


class WorkerStatusReply(Versioned):
    """`GET /v1/status/workers/{address}`: one worker, with the policy it should be using."""

    pool_id: int
    policy_version: int | None
    worker: WorkerStatus
