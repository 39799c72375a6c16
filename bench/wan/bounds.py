"""Lower bounds on the time for a version of S bytes to reach a set of followers, computed from
the topology file alone (link rates in bytes per second, round trips in seconds).

Through a relay tree with cut-through (ours), nothing can beat the slowest of:
  - each follower f receiving S over its downlink, after one request to its relay and the
    relay's request to the origin:      S / down_f + rtt(relay, f) + rtt(origin, relay)
  - each relay r sending S to each of its n_r followers over its uplink:  n_r * S / up_r
  - the origin sending S to each of the R relays over its uplink:         R * S / up_o
  - each relay receiving S:                                              S / down_r
Direct (every follower pulls from the origin):
  - each follower:  S / down_f + rtt(origin, f);  the origin:  N * S / up_o
These overlap in time (cut-through), so the bound is their maximum, not their sum.
"""

from __future__ import annotations

from collections import Counter

from prime_swarm.deploy.testbed.topology import Host, Testbed

TREE_FORMULA = (
    "max over followers f of S/down_f + rtt(relay_f, f) + rtt(origin, relay_f); "
    "over relays r of n_r*S/up_r and S/down_r + rtt(origin, r); R*S/up_origin"
)
DIRECT_FORMULA = "max(max over followers f of S/down_f + rtt(origin, f), N*S/up_origin)"


def _bps(mbit: float) -> float:
    return mbit * 1e6 / 8


def _rtt_s(bed: Testbed, a: Host, b: Host) -> float:
    return bed.rtt(a.region, b.region)[0] / 1000


def tree_bound(bed: Testbed, hosts: dict[str, Host], followers: list[Host], size: int) -> float:
    origin = hosts["operator"]
    per_relay = Counter(f"relay-{f.region}" for f in followers)
    terms = []
    for f in followers:
        relay = hosts[f"relay-{f.region}"]
        terms.append(size / _bps(f.down_mbit) + _rtt_s(bed, relay, f) + _rtt_s(bed, origin, relay))
    for name, n in per_relay.items():
        r = hosts[name]
        terms += [n * size / _bps(r.up_mbit), size / _bps(r.down_mbit) + _rtt_s(bed, origin, r)]
    terms.append(len(per_relay) * size / _bps(origin.up_mbit))
    return max(terms)


def direct_bound(bed: Testbed, hosts: dict[str, Host], followers: list[Host], size: int) -> float:
    origin = hosts["operator"]
    terms = [size / _bps(f.down_mbit) + _rtt_s(bed, origin, f) for f in followers]
    return max([*terms, len(followers) * size / _bps(origin.up_mbit)])
