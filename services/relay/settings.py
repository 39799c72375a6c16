"""Relay/origin settings: environment variables `PRIME_RELAY_*`, overridden by CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.observability.logs import LogLevel


class RelaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_RELAY_", extra="ignore")

    mode: Literal["origin", "relay"] = Field(
        default="relay",
        description="origin: accepts the trainer's uploads; relay: pulls from --parent URLs.",
    )
    host: str = Field(default="127.0.0.1", description="Interface to bind.")
    port: int = Field(default=8700, ge=0, le=65535, description="TCP port to listen on.")
    data_dir: Path = Field(
        default=Path("data/relay"), description="Version store (manifests and shards)."
    )
    trusted_trainer: str = Field(
        pattern=r"^0x[0-9a-fA-F]{40}$",
        description="Trainer address whose signature every manifest must carry.",
    )
    parents: list[str] = Field(
        default_factory=list,
        description="Relay mode: base URLs of the origin or relays to pull from (JSON list).",
    )
    keep_versions: int = Field(default=4, ge=1, description="Newest complete versions kept.")
    poll_interval_s: float = Field(
        default=1.0, gt=0, description="Relay mode: seconds between polls of the parents."
    )
    request_timeout_s: float = Field(
        default=10.0, gt=0, description="Timeout of each upstream HTTP request (connect/read)."
    )
    pull_workers: int = Field(
        default=8, ge=1, le=256, description="Relay mode: parallel shard downloads."
    )
    max_manifest_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Origin: largest manifest upload accepted."
    )
    access_log: bool = Field(default=False, description="Log every HTTP request (noisy).")
    log_level: LogLevel = Field(default="INFO", description="Log level.")

    @model_validator(mode="after")
    def _relay_needs_parents(self) -> RelaySettings:
        if self.mode == "relay" and not self.parents:
            raise ValueError("relay mode needs at least one parent URL")
        return self
