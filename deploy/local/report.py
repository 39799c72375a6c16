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
    run_dir: Path,
    rows: list[StepProgress],
    heldout_start: dict[str, float],
    heldout_end: dict[str, float],
) -> Path:
    """The sampled reward per step and the held-out reward at both ends, one colour per
    environment when the pool mixes several."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    last = rows[-1].step if rows else 1
    mixed = len(heldout_start) > 1
    if mixed:
        ax.plot(
            [r.step for r in rows],
            [r.mean_reward for r in rows],
            color="grey",
            alpha=0.4,
            label="rollout mean reward, all (sampled)",
        )
    for i, env in enumerate(sorted(heldout_start)):
        colour = f"C{i}" if mixed else "crimson"
        if mixed:
            steps = [r.step for r in rows if env in r.reward_by_env]
            ax.plot(
                steps,
                [r.reward_by_env[env] for r in rows if env in r.reward_by_env],
                marker=".",
                color=colour,
                label=f"{env}: rollout task reward (sampled)",
            )
        else:
            ax.plot(
                [r.step for r in rows],
                [r.mean_reward for r in rows],
                marker=".",
                label="rollout mean reward (sampled)",
            )
        ends = [heldout_start[env], heldout_end[env]]
        label = f"{env}: held-out (greedy)" if mixed else "held-out reward (greedy)"
        ax.scatter([0, last], ends, color=colour, zorder=3, label=label)
        ax.plot([0, last], ends, color=colour, linestyle="--", alpha=0.5)
    ax.set_xlabel("trainer step (policy version)")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title("Prime Swarm local run: GRPO through untrusted workers")
    path = run_dir / "reward.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
