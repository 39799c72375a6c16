"""The trainer's mathematics: GRPO advantages and loss, the step (padded, packed or with shared
prompts; one GPU or FSDP2), checkpoints, and the supervised step of the warm start.

It imports only `libs/model`: what the verifier and the orchestrator share with the trainer lives
below it (rewards and task lists in `libs/environments`, the aligned forward pass in
`libs/model/forward.py`), and what plays an environment lives in `libs/rollout`
(tests/unit/test_layering.py keeps it so). Tuned numbers live in `defaults.py`;
`bench/rl` (`python -m bench.rl`) is how they were chosen.
"""
