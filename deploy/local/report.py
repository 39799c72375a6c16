"""The run's summary.json and reward.png."""

from __future__ import annotations

import json
from pathlib import Path

from prime_swarm.protocol.messages import StepProgress


def write_summary(run_dir: Path, summary: dict[str, object]) -> Path:
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)
    return path


def plot_rewards(
    run_dir: Path, rows: list[StepProgress], heldout_start: float, heldout_end: float
) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(
        [r.step for r in rows],
        [r.mean_reward for r in rows],
        marker=".",
        label="rollout mean reward (sampled)",
    )
    last = rows[-1].step if rows else 1
    ax.scatter(
        [0, last],
        [heldout_start, heldout_end],
        color="crimson",
        zorder=3,
        label="held-out reward (greedy)",
    )
    ax.plot([0, last], [heldout_start, heldout_end], color="crimson", linestyle="--", alpha=0.5)
    ax.set_xlabel("trainer step (policy version)")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Prime Swarm local run: GRPO through untrusted workers")
    path = run_dir / "reward.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
