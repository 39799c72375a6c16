"""`make bench-rl`: the offline RL recipe over seeds."""
