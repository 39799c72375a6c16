"""The testbed file: what it accepts, what it refuses with a message, how groups expand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from prime_swarm.deploy.testbed.topology import Testbed

BASE = {
    "name": "t",
    "regions": {"op": {"rtt_ms": 1}, "eu": {"rtt_ms": 20, "jitter_ms": 2}},
    "links": [{"between": ["op", "eu"], "rtt_ms": 90, "jitter_ms": 8}],
    "hosts": {
        "origin": {"region": "op", "up_mbit": 1000, "down_mbit": 1000, "ports": [8700]},
        "follower": {"region": "eu", "up_mbit": 10, "down_mbit": 25, "count": 3},
    },
}


def test_groups_expand_to_numbered_hosts_with_distinct_addresses() -> None:
    bed = Testbed.model_validate(BASE)
    hosts = bed.expand()
    assert [h.name for h in hosts] == ["origin", "follower-1", "follower-2", "follower-3"]
    assert len({h.ip(bed.subnet) for h in hosts}) == 4
    assert bed.rtt("eu", "op") == (90, 8) and bed.rtt("eu", "eu") == (20, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"links": []}, "no link between regions 'eu' and 'op'"),
        ({"hosts": {"x": {"region": "mars", "up_mbit": 1, "down_mbit": 1}}}, "unknown region"),
        ({"faults": [{"at_s": 1, "kind": "kill", "host": "nobody"}]}, "unknown host 'nobody'"),
        ({"faults": [{"at_s": 1, "kind": "cut", "region": "eu"}]}, "names its region and for_s"),
        ({"tag": "much-too-long"}, "tag"),
        ({"regions": {"op": {"rtt_ms": -1}, "eu": {"rtt_ms": 1}}}, "greater than or equal"),
    ],
)
def test_a_bad_file_is_refused_with_a_reason(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Testbed.model_validate({**BASE, **change})


def test_the_benchmark_topology_loads() -> None:
    bed = Testbed.load(Path(__file__).resolve().parents[2] / "bench/wan/three_regions.toml")
    followers = [h for h in bed.expand() if h.group.startswith("follower-")]
    assert len(followers) >= 64 and {h.region for h in followers} == {"eu", "sa", "asia"}


def test_the_cli_names_the_problem_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bed.toml"
    bad.write_text('name = "x"\n[regions.a]\nrtt_ms = 1\n[regions.b]\nrtt_ms = 1\n[hosts]\n')
    out = subprocess.run(
        [sys.executable, "-m", "prime_swarm.deploy.local.cli", "testbed", "up", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "no link between regions 'a' and 'b'" in out.stderr
