"""The trainer's Prometheus metrics (the Grafana training dashboard reads these names)."""

from prometheus_client import Counter, Gauge, Histogram

STEPS = Counter("trainer_steps_total", "GRPO optimizer steps")
POLICY_VERSION = Gauge("trainer_policy_version", "Latest published policy version")
MEAN_REWARD = Gauge("trainer_batch_mean_reward", "Mean reward of the last step's batch")
REWARD_PART = Gauge(
    "trainer_batch_reward_part", "Mean reward part of the last step's batch", ["part"]
)
ENV_REWARD = Gauge(
    "trainer_env_task_reward",
    "Mean task reward of the last step's completions from each environment of the mixture",
    ["env"],
)
STEP_STAT = Gauge(
    "trainer_step_stat",
    "Loss statistics of the last step: clip fractions (low/high/delta), ratio and importance "
    "weight mean/min/max, masked/truncated fractions, kl, entropy, grad_norm, loss",
    ["stat"],
)
STALE_DROPPED = Counter("trainer_stale_dropped_total", "Rollout groups dropped for staleness")
FILTERED = Counter(
    "trainer_filtered_groups_total", "Zero-variance groups dropped by the online filter"
)
COMPLETIONS = Counter("trainer_completions_trained_total", "Completions that reached a step")
TOKENS_PER_S = Gauge("trainer_tokens_per_second", "Completion tokens per second of step time")
QUEUE_LAG = Gauge("trainer_queue_lag", "Verified rollouts not yet trained on")
STEP_SECONDS = Histogram(
    "trainer_step_seconds",
    "Compute time of one step (forward, backward, optimizer, snapshot)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
IDLE_SECONDS = Histogram(
    "trainer_idle_seconds",
    "Time a step waited for verified rollouts",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BUSY_FRACTION = Gauge("trainer_busy_fraction", "Share of wall time spent computing since warm-up")
CONSUMPTION_LAG = Histogram(
    "trainer_consumption_lag_versions",
    "Versions between the policy that generated a group and the step that trains it",
    buckets=(0, 1, 2, 3, 4, 6, 8, 16),
)
QUEUE_SECONDS = Histogram(
    "trainer_rollout_age_seconds",
    "Seconds from a group's arrival at the orchestrator to the step that trains it",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
SAVE_SECONDS = Histogram("trainer_checkpoint_seconds", "Writing one checkpoint (background)")
PUBLISH_SECONDS = Histogram("trainer_publish_seconds", "Uploading and announcing one version")
UNREPLICATED_ACKS = Counter(
    "trainer_unreplicated_acks_total",
    "Step acknowledgements a connected Redis replica did not confirm within the WAIT timeout",
)
