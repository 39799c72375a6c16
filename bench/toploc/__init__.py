"""`make bench-toploc`: verification end to end and its cost (`python -m bench.toploc`), the
calibration the acceptance limits are set from (models.py), multi-turn rollouts (multi_turn.py)
and the GPU's side (cross_device.py), all in bench/results/toploc.json."""
