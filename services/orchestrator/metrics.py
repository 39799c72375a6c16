from prometheus_client import Counter, Gauge

REQUESTS_REFUSED = Counter(
    "orchestrator_refused_total",
    "Worker requests refused, by route and reason",
    ["route", "reason"],
)
LEASES_ISSUED = Counter("orchestrator_leases_issued_total", "Leases handed to workers")
LEASES_REISSUED = Counter(
    "orchestrator_leases_reissued_total", "Tasks of expired, unanswered leases handed out again"
)
SUBMISSIONS = Counter("orchestrator_submissions_total", "Submissions admitted to validation")
WORKERS_SEEN = Gauge("orchestrator_workers_registered", "Workers registered with this pool")
POLICY_VERSION = Gauge("orchestrator_policy_version", "Latest announced policy version")
IN_FLIGHT = Gauge(
    "orchestrator_in_flight_groups",
    "Groups leased but not yet taken by the trainer (lease admission input)",
)
WORKERS_EJECTED = Counter(
    "orchestrator_workers_ejected_total", "Silent workers ejected on chain with the owner's key"
)
EJECTIONS_HELD = Gauge(
    "orchestrator_ejections_held",
    "1 while silent workers are not ejected because the silence is the pool's (replicas or "
    "Redis were down, or a large share of the roster went silent at once)",
)
PROMPTS_SELECTED = Counter(
    "orchestrator_prompts_selected_total",
    "Tasks drawn by live prompt selection, by environment and what became of them "
    "(drawn, skipped, explored, forced)",
    ["env", "what"],
)
LEASES_BY_ENV = Counter(
    "orchestrator_leases_by_env_total", "Leases handed to workers, by environment", ["env"]
)
