"""Warm start: a short, deliberately imperfect supervised run before RL.

The demonstrations come from a noisy teacher that makes the env's systematic mistake at
`error_rate`. The model learns the task's structure and format, but with the mistake as its
greedy choice, so RL starts from a policy whose samples contain the right answer often enough for
GRPO to find and reinforce it: headroom that only RL can close.

It sits above the libraries it joins, so none of them imports another for it: the environment
(`libs/environments`) plays the teacher, `libs/rollout/demonstrations.py` turns its turns into an
episode's tokens, and `libs/rl/sft.py` trains on those tokens.
"""

from prime_swarm.libs.warmstart.policy import MARKER_FILE, RECIPE_VERSION, warm_start

__all__ = ["MARKER_FILE", "RECIPE_VERSION", "warm_start"]
