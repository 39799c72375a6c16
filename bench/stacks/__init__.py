"""Honest work verified across the stacks contributors run (`make bench-stacks`): workers in
process environments, interpreters and package sets of their own, judged by validators on
stacks no worker has; bench/results/stacks.json. `__main__.py` builds and drives the stacks,
`side.py` is what runs inside each one."""
