"""GRPO building blocks: environments, replayable sampling, advantages, loss, warm start, eval.

Tuned numbers live in `defaults.py`; `bench/rl_offline.py` is how they were chosen.
"""
