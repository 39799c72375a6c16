"""`make bench-wan`: SHARDCAST over a simulated wide area (bench/wan/three_regions.toml).

time_to_n: for N = 1, 4, 16, 64 followers spread over three regions, the seconds from the
publish of a version at the origin until the last follower holds it verified and installed:
a full SmolLM2-135M version in bf16, then the next version as a delta, through our relay tree
(`ours_s`), with every follower pulling from the origin (`direct_s`), and through the reference
shardcast 0.3.2 on the same hosts (`reference_s`; it has no deltas, so its delta figure is the
whole file again, measured as its full case), each beside the lower bound of bench/wan/bounds.py.
churn: a relay killed mid-broadcast, a quarter of the followers joining mid-way, a region cut
off for 60 s; each must complete with no wrong byte installed.
pool: the `make up` pool with nine workers across the regions against the same on loopback,
with a region cut for 60 s mid-run (bench/wan/pool.py); switch_pause_s from its workers.
deltas: SmolLM2's deltas over real RL steps of the network (bench/wan/deltas.py).

    python -m bench.wan [--only time-to-n,churn,pool,deltas] [--n 1,4,16,64]
                        [--systems ours,direct,reference]

Writes bench/results/wan.json (other sections kept) and bench/results/wan_cdf.png. Needs root
(network namespaces); sizes: 64 followers are light processes (no torch), the links are slow
enough that the machine's 2 cores are never the bottleneck (the emulator's own CPU is reported).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from eth_account import Account

from prime_swarm.deploy.testbed.net import LiveTestbed, available
from prime_swarm.deploy.testbed.topology import Testbed

from . import deltas, pool
from .bounds import DIRECT_FORMULA, TREE_FORMULA, direct_bound, tree_bound
from .delivery import REF_VENV, Arrivals, Delivery, followers, log
from .versions import versions

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = Path(__file__).with_name("three_regions.toml")
RESULTS = ROOT / "bench" / "results" / "wan.json"
PLOT = ROOT / "bench" / "results" / "wan_cdf.png"
CHURN_N = 16


def load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(section: str, value: Any) -> None:
    data = load()
    data[section] = value
    data["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def summary(a: Arrivals) -> dict[str, Any]:
    return {
        "last_s": a.last_s,
        "completed": a.completed,
        "wrong_installs": a.wrong_installs,
        "bytes": a.bytes,
        "publish_s": a.publish_s,
        "retries": a.retries,
        "cpu_s": a.cpu_s,
        "cpu_floor_s": round(sum(a.cpu_s.values()) / (os.cpu_count() or 1), 1),
        "machine_busy": a.machine_busy,
        "arrivals_s": sorted(s for s in a.seconds.values() if s is not None),
        "notes": a.notes[:6],
    }


def time_to_n(live: LiveTestbed, d: Delivery, work: Path, v1: Path, v2: Path,
              ns: list[int], systems: list[str]) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {}
    if RESULTS.exists():
        out = json.loads(RESULTS.read_text()).get("time_to_n", {})
    for n in ns:
        hosts = followers(live, n)
        row = out.setdefault(str(n), {"full": {}, "delta": {}})
        for system in systems:
            log(f"N={n} {system}")
            case = work / f"n{n}-{system}"
            if system == "reference":
                ref = d.reference(case, hosts, v1)
                row["full"]["reference_s"] = ref.last_s
                row["full"]["reference"] = summary(ref)
                row["delta"]["reference_s"] = ref.last_s  # no deltas: the whole file again
                continue
            got = d.ours(case, hosts, v1, v2, direct=system == "direct")
            key = "ours" if system == "ours" else "direct"
            for kind, a in got.items():
                row[kind][f"{key}_s"] = a.last_s
                row[kind][key] = summary(a)
                row[kind]["bound_s"] = round(tree_bound(live.bed, live.hosts, hosts, a.bytes), 3)
                row[kind]["direct_bound_s"] = round(
                    direct_bound(live.bed, live.hosts, hosts, a.bytes), 3
                )
                if ours := row[kind].get("ours_s"):
                    row[kind]["bound_over_ours"] = round(row[kind]["bound_s"] / ours, 3)
        out[str(n)] = row
        save("time_to_n", out)
        save("bounds", {"tree": TREE_FORMULA, "direct": DIRECT_FORMULA,
                        "topology": str(TOPOLOGY.relative_to(ROOT))})  # fmt: skip
    return out


def churn(live: LiveTestbed, d: Delivery, work: Path, v1: Path) -> dict[str, Any]:
    hosts = followers(live, CHURN_N)
    out: dict[str, Any] = {}

    def record(name: str, a: Arrivals, **extra: Any) -> None:
        out[name] = {"n": CHURN_N, **summary(a), **extra}
        out[name]["bound_s"] = round(tree_bound(live.bed, live.hosts, hosts, a.bytes), 3)
        save("churn", out)

    # A relay lost 15 s into the broadcast; its region's followers also know the origin.
    victim = "relay-eu"
    killed: list[float] = []

    def kill(t: float) -> None:
        if t >= 15 and not killed:
            live.kill_host(victim)
            killed.append(t)
            log(f"  killed {victim} at {t:.1f}s")

    log("churn: relay killed")
    got = d.ours(work / "churn-relay", hosts, v1, None, fallback=True, during=kill)
    record("relay_killed", got["full"], killed=victim, at_s=15)

    # A quarter of the followers join 30 s after the publish.
    late = {h.name: 30.0 for h in hosts[::4]}
    log("churn: late joiners")
    got = d.ours(work / "churn-late", hosts, v1, None, late=late)
    record("late_joiners", got["full"], joined=sorted(late), at_s=30)

    # A region cut off from every other for 60 s as soon as the version is published, then
    # healed. Cut later, it would miss: the region's relay (1 Gbit/s) holds the whole version
    # seconds after the publish and its followers keep pulling from it through the cut (the
    # 10 s cut of the 10 Mbit/s run cost nothing).
    region = "asia"
    state_: dict[str, float] = {}

    def cut(t: float) -> None:
        if "cut" not in state_:
            live.cut(region)
            state_["cut"] = t
            log(f"  cut {region} at {t:.1f}s")
        if t >= state_["cut"] + 60 and "healed" not in state_:
            live.heal(region)
            state_["healed"] = t
            log(f"  healed {region} at {t:.1f}s")

    log("churn: region cut for 60 s")
    got = d.ours(work / "churn-cut", hosts, v1, None, during=cut)
    if "healed" not in state_:
        live.heal(region)
    record("region_cut", got["full"], region=region, at_s=round(state_["cut"], 1), for_s=60)
    return out


def pool_section(live: LiveTestbed, work: Path) -> dict[str, Any]:
    """The pool across the regions, and the same pool on loopback (bench/wan/pool.py)."""
    log("pool on loopback")
    loopback = pool.run(work / "loopback", None)
    log("pool across the regions")
    wan = pool.run(work / "wan", live)
    books = wan["books"]
    out = {
        "regions": len({h.region for h in live.hosts.values()} - {"operator"}),
        "workers": wan["workers"],
        "steps": wan["steps"],
        "heldout_start": wan["heldout_start"],
        "heldout_end": wan["heldout_end"],
        "trained_twice": books["rollouts"]["trained_twice"],
        "unaccounted": books["rollouts"]["unaccounted"],
        "chain_equals_validators": books["onchain_units"] == books["validator_units"],
        "stale_share_wan": pool.stale_share(books),
        "stale_share_loopback": pool.stale_share(loopback["books"]),
        "stakes_unchanged": wan["stakes_unchanged"],
        "ejected": wan["ejected"],
        "region_cut": wan.get("region_cut"),
        "wan": wan,
        "loopback": loopback,
    }
    save("pool", out)
    save("switch_pause_s", wan["switch_pause_s"])
    return out


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(RESULTS.read_text())
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, kind in zip(axes[:2], ("full", "delta"), strict=True):
        for n, row in sorted(data.get("time_to_n", {}).items(), key=lambda kv: int(kv[0])):
            for system, style in (("ours", "-"), ("direct", "--"), ("reference", ":")):
                s = row.get(kind, {}).get(system) or (
                    row.get("full", {}).get(system) if system == "reference" else None
                )
                if s and s["arrivals_s"]:
                    xs = s["arrivals_s"]
                    ax.step(xs, [(i + 1) / int(n) for i in range(len(xs))], style, where="post",
                            label=f"{system} N={n}")  # fmt: skip
        ax.set_title(f"{kind} version: followers holding it")
        ax.set_xlabel("seconds after publish")
        ax.set_ylabel("share of followers")
        ax.legend(fontsize=6)
    for name, s in data.get("churn", {}).items():
        xs = s["arrivals_s"]
        axes[2].step(xs, [(i + 1) / s["n"] for i in range(len(xs))], where="post", label=name)
    axes[2].set_title(f"churn, full version, N={CHURN_N}")
    axes[2].set_xlabel("seconds after publish")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.wan")
    p.add_argument("--only", default="time-to-n,churn,pool,deltas")
    p.add_argument("--n", default="1,4,16,64")
    p.add_argument("--systems", default="ours,direct,reference")
    p.add_argument("--topology", type=Path, default=TOPOLOGY)
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the work folder (every process's log) instead of removing it",
    )
    a = p.parse_args()
    sections = a.only.split(",")
    if "reference" in a.systems.split(",") and not (REF_VENV / "bin" / "python").exists():
        # Without it every reference case "never completes": a figure that is not one.
        raise SystemExit(
            f"bench-wan: --systems reference needs {REF_VENV.relative_to(ROOT)} "
            "(`make bench-wan` creates it)"
        )
    work = Path(tempfile.mkdtemp(prefix="wan-bench-"))
    if {"time-to-n", "churn", "pool"} & set(sections):
        if why := available():
            raise SystemExit(f"bench-wan: {why}")
        on_testbed(sections, a, work)
    if "deltas" in sections:
        log("deltas: the SmolLM2 pool on loopback")
        found = deltas.run(work / "deltas")
        save("deltas", found)
        save("delta_bytes_ratio", found["delta_bytes_ratio"])
    if a.keep_work:
        log(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    plot()
    return 0


def on_testbed(sections: list[str], a: argparse.Namespace, work: Path) -> None:
    bed = Testbed.load(a.topology)
    trainer = Account.create()
    started = time.monotonic()
    with LiveTestbed(bed, work / "testbed") as live:
        d = Delivery(live, work, trainer)
        try:
            if {"time-to-n", "churn"} & set(sections):
                v1, v2 = versions(ROOT / ".cache")
                if "time-to-n" in sections:
                    ns = [int(x) for x in a.n.split(",")]
                    time_to_n(live, d, work, v1, v2, ns, a.systems.split(","))
                if "churn" in sections:
                    churn(live, d, work, v1)
            if "pool" in sections:
                pool_section(live, work)
        finally:
            stats = live.link_stats()
            gb = stats["bytes"] / 1e9
            # Per run of the bench, keyed by the sections it ran: what the emulator cost there.
            seen = load().get("link_emulator", {})
            seen[",".join(s for s in sections if s != "deltas")] = {
                "processes": 2, "bytes_forwarded": int(stats["bytes"]),
                "cpu_s": round(stats["cpu_s"], 1),
                "cpu_s_per_gb": round(stats["cpu_s"] / gb, 2) if gb else None,
                "bench_wall_s": round(time.monotonic() - started, 1),
            }  # fmt: skip
            save("link_emulator", seen)


if __name__ == "__main__":
    raise SystemExit(main())
