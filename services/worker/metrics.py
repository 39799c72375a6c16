from prometheus_client import Counter

SUBMITTED = Counter("worker_submissions_total", "Rollout groups accepted by the orchestrator")
REFUSED = Counter("worker_refused_total", "Submissions refused, by reason", ["reason"])
