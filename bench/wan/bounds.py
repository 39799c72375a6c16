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

S is what crosses a link, not the file: a link's rate counts frames (tc's tbf counts each
packet's bytes from its Ethernet header on), and a 1500-byte-MTU TCP segment with timestamps
carries 1448 bytes of payload in a 1514-byte frame, so S = file bytes * 1514/1448 (+4.6 %).
Measured on this testbed's links: 30 MB through one 25 Mbit/s tbf takes 10.02 s, against
9.60 s for the payload alone and 10.04 s with the framing.
"""

from __future__ import annotations

from collections import Counter

from prime_swarm.deploy.testbed.topology import Host, Testbed

TREE_FORMULA = (
    "S = file bytes * 1514/1448 (TCP/IP/Ethernet framing); "
    "max over followers f of S/down_f + rtt(relay_f, f) + rtt(origin, relay_f); "
    "over relays r of n_r*S/up_r and S/down_r + rtt(origin, r); R*S/up_origin"
)
DIRECT_FORMULA = (
    "S = file bytes * 1514/1448; max(max over followers f of S/down_f + rtt(origin, f), "
    "N*S/up_origin)"
)


# Ethernet (14) + IPv4 (20) + TCP with timestamps (32) around an MSS of 1448.
WIRE_BYTES_PER_PAYLOAD_BYTE = 1514 / 1448


def _bps(mbit: float) -> float:
    return mbit * 1e6 / 8


def _rtt_s(bed: Testbed, a: Host, b: Host) -> float:
    return bed.rtt(a.region, b.region)[0] / 1000


def tree_bound(bed: Testbed, hosts: dict[str, Host], followers: list[Host], size: int) -> float:
    origin, size = hosts["operator"], size * WIRE_BYTES_PER_PAYLOAD_BYTE
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
    origin, size = hosts["operator"], size * WIRE_BYTES_PER_PAYLOAD_BYTE
    terms = [size / _bps(f.down_mbit) + _rtt_s(bed, origin, f) for f in followers]
    return max([*terms, len(followers) * size / _bps(origin.up_mbit)])
