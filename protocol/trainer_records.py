"""What the trainer records in Redis that other roles read (its `trainer:*` prefix).

- `TRAINED`: every submission id a saved step trained on. The trainer checks it before training
  a reclaimed entry (exactly once across restarts: services/trainer/persist.py).
- `TRAINED_BY_STEP`: each saved step's trained ids, comma-joined (written once per step, also
  when a restart re-adds a saved step's ids); a submission in two steps' lists was trained twice.
- `DROPPED`: every id dropped untrained, with why (stale, zero variance).

The last two are the audit trail the operator's books read (deploy/local/books.py, as the
read-only `auditor` of deploy/redis_acl.py).
"""

TRAINED = "trainer:trained_submissions"  # set of submission ids
TRAINED_BY_STEP = "trainer:trained_by_step"  # hash: step -> "id,id,..."
DROPPED = "trainer:dropped_submissions"  # hash: submission id -> reason
