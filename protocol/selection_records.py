"""What live prompt selection keeps in Redis (libs/rollout/selection.py).

- `PASS_RATES`: prompt key -> the last accepted group's mean task reward, written by validators
  and read by orchestrators when they draw the next task.
- `COUNTS`: "<env>:<what>" -> count, what selection did over the run: `drawn` tasks drawn,
  `skipped` (not leased: a lease, a group's generations and a validation saved), `explored`
  (outside the band, leased by the exploration floor), `forced` (leased because a lease ran out
  of skips). Written by orchestrators, read by the launcher's summary.
"""

PASS_RATES = "selection:pass_rates"
COUNTS = "selection:counts"
