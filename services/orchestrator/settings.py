"""Orchestrator settings: environment variables prefixed PRIME_ORCH_, or a JSON/TOML file."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prime_swarm.libs.guard.ratelimit import Rate
from prime_swarm.libs.observability.logs import LogLevel
from prime_swarm.libs.rollout.recipe import Recipe
from prime_swarm.libs.rollout.wire import batch_body_bytes


class RouteRates(BaseModel):
    """Per-worker limits of each signed route; a worker over one gets 429 with Retry-After."""

    # Named after the route's `name`; not `register`, which every BaseModel has (ABCMeta).
    registration: Rate = Field(
        default_factory=lambda: Rate(per_second=0.2, burst=5),
        description="Registrations: once per session, so a handful is plenty.",
    )
    heartbeat: Rate = Field(
        default_factory=lambda: Rate(per_second=5.0, burst=20),
        description="Heartbeats: one every `heartbeat_interval_s`, plus one per policy version "
        "a worker learns it is stale (every step of a synchronous pool).",
    )
    lease: Rate = Field(
        default_factory=lambda: Rate(per_second=20.0, burst=40),
        description="Lease requests: one per batch generated, more while the pool is idle.",
    )
    submit: Rate = Field(
        default_factory=lambda: Rate(per_second=50.0, burst=100),
        description="Submissions: one per lease; a fast worker answers dozens a second.",
    )
    submit_batch: Rate = Field(
        default_factory=lambda: Rate(per_second=10.0, burst=20),
        description="Batched submissions: one per generated batch of leases.",
    )


class OrchestratorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIME_ORCH_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, description="HTTP port.")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis for streams and leases; redis+sentinel://HOST:PORT,.../SERVICE/DB "
        "finds the primary through Sentinel (docs/high-availability.md).",
    )
    replica_wait_ms: int = Field(
        1000,
        ge=0,
        description="With a Sentinel URL: how long a submission's acknowledgement waits for a "
        "replica to hold it (WAIT) before the worker is told to retry; 0 acknowledges at once, "
        "and a failover may then lose acknowledged work.",
    )
    rpc_url: str = Field("http://127.0.0.1:8545", description="JSON-RPC of the ledger's chain.")
    ledger_address: str = Field(..., description="Address of the deployed SwarmLedger.")
    pool_id: int = Field(..., ge=1, description="The on-chain pool this orchestrator fronts.")
    relays: list[str] = Field(
        default_factory=list, description="Relay base URLs handed to workers for downloads."
    )
    recipe: Recipe = Field(
        default_factory=Recipe, description="The pool's recipe (PRIME_RECIPE_* variables)."
    )
    task_seed: int = Field(0, description="Seed of the training task stream.")
    train_tasks: int | None = Field(
        None,
        ge=1,
        le=2**48,
        description="Train tasks per environment the stream cycles over, as a finite dataset "
        "does (live prompt selection learns from prompts that recur); None: the whole split.",
    )
    task_file: Path | None = Field(
        None,
        description="Tasks to lease, from `prime-swarm filter-tasks` (those whose pass rate under "
        "the policy is inside a band); None leases the env's whole train split.",
    )
    lease_ttl_s: float = Field(120.0, gt=0, description="How long a worker may hold a lease.")
    heartbeat_interval_s: float = Field(2.0, gt=0, description="Interval workers should keep.")
    heartbeat_ttl_s: float = Field(
        30.0,
        gt=0,
        description="A worker not heard from (heartbeat or lease request) for this long no "
        "longer counts as live when the in-flight budget is shared out.",
    )
    owner_key_file: Path | None = Field(
        None,
        description="The pool owner's key file. With it, workers silent for `eject_after_s` "
        "are ejected on chain (no slash: their stake unbonds). None: nobody is ejected.",
    )
    eject_after_s: float = Field(
        600.0,
        gt=0,
        description="Silence (no heartbeat, no lease request) after which a worker is ejected.",
    )
    eject_max_silent_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="When a worker is silent past `eject_after_s` while more than this share "
        "of the roster is unheard for the shorter of `heartbeat_ttl_s` and half of it, nobody "
        "is ejected: correlated silence is an outage (the orchestrator's region, balancer or "
        "route), not contributors leaving.",
    )
    lease_spread: float = Field(
        1.5,
        ge=1.0,
        description="How unevenly leases may spread: a worker holds at most this many times its "
        "even share of `max_in_flight_groups` over the live workers (1 = strictly even).",
    )
    max_open_leases_per_worker: int = Field(
        64,
        ge=1,
        description="Open leases one worker may hold (a batch being generated plus the one "
        "being proved and submitted).",
    )
    max_in_flight_groups: int = Field(
        64,
        ge=1,
        description="Groups leased but not yet taken by the trainer, pool-wide (open leases, "
        "awaiting validation, awaiting the trainer; the batch it is stepping on no longer "
        "counts): about one trainer step keeps the trainer busy without leasing work that "
        "turns stale before it is trained.",
    )
    max_clock_skew_s: float = Field(30.0, gt=0, description="Signed-request timestamp window.")
    rate_limits: RouteRates = Field(
        default_factory=RouteRates, description="Per-worker rate limits of the signed routes."
    )
    chain_lookup_rate: Rate = Field(
        default_factory=lambda: Rate(per_second=20.0, burst=50),
        description="Pool-wide budget of uncached stake lookups on chain, so that requests from "
        "throwaway keys cannot make the orchestrator spend chain calls at will.",
    )
    standing_cache_s: float = Field(
        300.0,
        gt=0,
        description="How long a worker's on-chain standing is trusted before re-reading; a "
        "ledger event about its stake or membership drops it sooner (standing_events_poll_s).",
    )
    standing_events_poll_s: float = Field(
        1.0,
        gt=0,
        description="How often the ledger's worker events are read to drop changed standings: "
        "how long a worker who left or was slashed may still be served.",
    )
    status_rate: Rate = Field(
        default_factory=lambda: Rate(per_second=2.0, burst=20),
        description="Per client IP limit of the unsigned status API (a page polls every few "
        "seconds). Behind a proxy every client shares the proxy's IP.",
    )
    status_max_workers: int = Field(
        500, ge=1, le=10_000, description="Workers listed by /v1/status, last seen first."
    )
    status_rewards: int = Field(
        60, ge=1, le=1_000, description="Recent trainer steps /v1/status reports."
    )
    status_cache_s: float = Field(
        1.0, ge=0, description="How long one assembled /v1/status answer is served again."
    )
    relay_check_interval_s: float = Field(
        5.0, gt=0, description="How long a relay health check is reused before another."
    )
    relay_check_timeout_s: float = Field(
        1.0, gt=0, description="Timeout of one relay health check (GET /healthz)."
    )
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest request body read, whatever the framing. Unset: a signed batch "
        "of max_open_leases_per_worker submissions at the recipe's largest "
        "(libs/rollout/wire.py).",
    )
    chain_timeout_s: float = Field(10.0, gt=0, description="Timeout of each chain call.")
    log_level: LogLevel = Field("INFO", description="Log level.")

    def body_cap(self) -> int:
        """The request body cap: the one set, or what the recipe's largest honest batch takes."""
        return self.max_body_bytes or batch_body_bytes(self.recipe, self.max_open_leases_per_worker)
