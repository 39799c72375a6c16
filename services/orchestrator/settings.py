"""Orchestrator settings: environment variables prefixed PRIME_ORCH_, or a JSON/TOML file."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.rl.defaults import RL


class OrchestratorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_ORCH_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, description="HTTP port.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis for streams and leases.")
    rpc_url: str = Field("http://127.0.0.1:8545", description="JSON-RPC of the ledger's chain.")
    ledger_address: str = Field(..., description="Address of the deployed SwarmLedger.")
    pool_id: int = Field(..., ge=1, description="The on-chain pool this orchestrator fronts.")
    trainer_address: str = Field(..., description="The trainer key that signs manifests.")
    relays: list[str] = Field(
        default_factory=list, description="Relay base URLs handed to workers for downloads."
    )
    env: str = Field(RL.env, description="Environment name whose tasks are leased.")
    task_seed: int = Field(0, description="Seed of the training task stream.")
    group_size: int = Field(
        RL.group_size, ge=1, le=64, description="Completions per leased prompt."
    )
    temperature: float = Field(RL.temperature, gt=0, description="Sampling temperature in leases.")
    max_new_tokens: int = Field(RL.max_new_tokens, gt=0, description="Generation budget in leases.")
    async_level: int = Field(
        RL.async_level,
        ge=0,
        description="Rollouts from policy v are admitted while v >= step - async_level.",
    )
    lease_ttl_s: float = Field(120.0, gt=0, description="How long a worker may hold a lease.")
    heartbeat_interval_s: float = Field(2.0, gt=0, description="Interval workers should keep.")
    max_open_leases_per_worker: int = Field(
        4, ge=1, description="Admission control: open leases a single worker may hold."
    )
    max_submitted_backlog: int = Field(
        2000, ge=1, description="Refuse new leases while this many rollouts await validation."
    )
    max_clock_skew_s: float = Field(30.0, gt=0, description="Signed-request timestamp window.")
    chain_timeout_s: float = Field(10.0, gt=0, description="Timeout of each chain call.")
    log_level: str = Field("INFO", description="Log level.")
