from prometheus_client import Counter, Gauge

STEPS = Counter("trainer_steps_total", "GRPO optimizer steps")
POLICY_VERSION = Gauge("trainer_policy_version", "Latest published policy version")
MEAN_REWARD = Gauge("trainer_batch_mean_reward", "Mean reward of the last step's batch")
STALE_DROPPED = Counter("trainer_stale_dropped_total", "Rollouts dropped for staleness")
QUEUE_LAG = Gauge("trainer_queue_lag", "Verified rollouts not yet trained on")
