from prometheus_client import Counter, Gauge, Histogram

VERDICTS = Counter("validator_verdicts_total", "Verdicts by outcome and reason", ["reason"])
LATENCY = Histogram(
    "validator_batch_seconds",
    "Seconds to validate one batch",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("validator_queue_depth", "Submissions waiting for validation")
CHAIN_QUEUE = Gauge("validator_chain_queue", "Chain actions waiting to be sent")
ATTESTED_UNITS = Counter("validator_attested_units_total", "Units attested on chain")
SLASHES = Counter("validator_slashes_total", "Slashing transactions sent")
CHAIN_ERRORS = Counter("validator_chain_errors_total", "Failed chain flushes")
VERSION_LAG = Gauge("validator_policy_lag", "Latest version minus the last batch's mean version")
PREFILL_SECONDS = Histogram(
    "validator_prefill_seconds",
    "Seconds to recompute and judge one batch (the fp32 and declared-precision prefills, "
    "proof checks, second opinions)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
UNDECODABLE = Counter("validator_undecodable_total", "Submissions that could not be decoded")
DEFERRED = Counter(
    "validator_deferred_total",
    "Submissions left pending because their policy version could not be fetched or loaded, "
    "or is newer than the announced one",
)
SUSPECTS = Counter(
    "validator_suspects_total",
    "Groups between the accept and reject bands, by how the second opinion settled them "
    "(accept, reject, held for a validator of the worker's device class)",
    ["settled"],
)
AUDITS = Counter(
    "validator_audits_total",
    "Spot checks of work accepted from another device class: queued here for that class, and "
    "passed or failed (slashed) when this validator is of it",
    ["outcome"],
)
ENV_DISPUTED = Counter(
    "validator_env_disputed_total",
    "Groups held, not slashed, because their environment failed to replay for other workers "
    "too: it answers otherwise on other machines or runs (deploy/prometheus/alerts.yml)",
    ["env"],
)
ENV_UNSETTLED = Counter(
    "validator_env_unsettled_total",
    "Groups held, not slashed, whose environment tokens did not replay while too few other "
    "workers witness the environment replaying (libs/rollout/env_disputes.py)",
    ["env"],
)
ENV_NONDETERMINISTIC = Counter(
    "validator_env_nondeterministic_total",
    "Groups held, not slashed, because their environment disagreed with itself when replayed "
    "again (an environment's bug: deploy/prometheus/alerts.yml pages on any)",
    ["env"],
)
