"""Validator settings: environment variables prefixed PRIME_VALIDATOR_."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.observability.logs import LogLevel
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.protocol.messages import Address


class ValidatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_VALIDATOR_", extra="ignore")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis with the streams.")
    rpc_url: str = Field("http://127.0.0.1:8545", description="JSON-RPC of the ledger's chain.")
    ledger_address: str = Field(..., description="Address of the SwarmLedger contract.")
    pool_id: int = Field(..., ge=1, description="Pool whose work this validator checks.")
    key_file: Path = Field(..., description="Validator key; registered on chain by the owner.")
    trusted_trainer: Address | None = Field(
        None,
        description="Pin the trainer address that signs manifests. Default: the trainer named "
        "in the pool's record on chain.",
    )
    relays: list[str] = Field(..., description="Relay URLs to download policies from.")
    cache_dir: Path = Field(Path(".cache/validator"), description="Downloaded policies.")
    keep_versions: int = Field(4, ge=1, description="Policy versions kept loaded.")
    recipe: Recipe = Field(
        default_factory=Recipe, description="The pool's recipe (PRIME_RECIPE_* variables)."
    )
    device: str = Field("cpu", description="Where the prefill runs: cpu or cuda.")
    audit_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Of the work accepted from a device class other than this validator's "
        "(judged by the fp32 weight ratio alone), the fraction also spot-checked by a validator "
        "of the declared class: a worker that lies about its class to pass int8 work off as bf16 "
        "is slashed there with this probability per group.",
    )
    reward_tolerance: float = Field(1e-6, ge=0, description="Slack on a claimed reward.")
    batch_size: int = Field(16, ge=1, description="Submissions read (and prefilled) per batch.")
    attest_batch_size: int = Field(
        64,
        ge=1,
        le=256,
        description="Work items per attest transaction (the ledger takes up to 256). Gas per "
        "item falls with the batch: about 92k alone, 4.8k in a batch of 64 from 4 workers "
        "(bench/results/chain.json).",
    )
    attest_interval_s: float = Field(
        2.0, gt=0, description="Flush attestations at least this often."
    )
    consumer: str | None = Field(
        None,
        description="Consumer name in the validators group; unique per validator process. "
        "Default: derived from the validator's address and host name, so that two operators "
        "never share one (and a restarted validator finds its own pending entries).",
    )
    reclaim_idle_ms: int = Field(30_000, description="Reclaim entries idle this long.")
    chain_timeout_s: float = Field(30.0, gt=0, description="Timeout of each chain call.")
    http_timeout_s: float = Field(30.0, gt=0, description="Timeout of each download request.")
    metrics_host: str = Field("127.0.0.1", description="Interface for /healthz and /metrics.")
    metrics_port: int = Field(0, description="Port for /healthz and /metrics (0: disabled).")
    threads: int = Field(1, ge=1, description="torch intra-op threads.")
    log_level: LogLevel = Field("INFO", description="Log level.")
