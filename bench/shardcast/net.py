"""Where benchmark nodes run: plain loopback, or one network namespace per node over shaped veths.

Shaped layout: a hub namespace holds a bridge; every node namespace has one veth into it, shaped
with `tc tbf` in both directions (the node's upload on its own end, its download on the hub's
end). The bench itself joins the bridge unshaped, so it can reach every node for health checks.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Sequence

SUBNET = "10.77.0"
CONTROL_IP = f"{SUBNET}.254"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Loopback:
    shaped = False

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self._ports = {n: free_port() for n in nodes}

    def host(self, node: str) -> str:
        return "127.0.0.1"

    def port(self, node: str) -> int:
        return self._ports[node]

    def url(self, node: str) -> str:
        return f"http://{self.host(node)}:{self.port(node)}"

    def prefix(self, node: str) -> list[str]:
        return []

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class ShapedNamespaces(Loopback):
    shaped = True

    def __init__(self, nodes: Sequence[str], rate_mbit: int, tag: str = "scb") -> None:
        super().__init__(nodes)
        self.rate_mbit = rate_mbit
        self.tag = tag
        self.hub = f"{tag}-hub"
        self._ip = {n: f"{SUBNET}.{i + 1}" for i, n in enumerate(nodes)}
        self._ports = dict.fromkeys(nodes, 8000)

    def ns(self, node: str) -> str:
        return f"{self.tag}-{self.nodes.index(node)}"

    def host(self, node: str) -> str:
        return self._ip[node]

    def prefix(self, node: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node)]

    def _shape(self, ns: str | None, dev: str) -> None:
        cmd = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit}mbit"]
        cmd += ["burst", "256kb", "latency", "100ms"]
        _sh(*(["ip", "netns", "exec", ns] if ns else []), *cmd)

    def setup(self) -> None:
        self.teardown()
        _sh("ip", "netns", "add", self.hub)
        hub = ["ip", "netns", "exec", self.hub]
        _sh(*hub, "ip", "link", "add", "br0", "type", "bridge")
        _sh(*hub, "ip", "link", "set", "br0", "up")
        _sh(*hub, "ip", "link", "set", "lo", "up")
        for i, node in enumerate(self.nodes):
            ns, a, b = self.ns(node), f"{self.tag}{i}a", f"{self.tag}{i}b"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _sh("ip", "link", "set", a, "netns", ns)
            _sh("ip", "link", "set", b, "netns", self.hub)
            inside = ["ip", "netns", "exec", ns]
            _sh(*inside, "ip", "link", "set", "lo", "up")
            _sh(*inside, "ip", "addr", "add", f"{self._ip[node]}/24", "dev", a)
            _sh(*inside, "ip", "link", "set", a, "up")
            _sh(*hub, "ip", "link", "set", b, "master", "br0")
            _sh(*hub, "ip", "link", "set", b, "up")
            self._shape(ns, a)  # the node's upload
            self._shape(self.hub, b)  # the node's download
        # The bench's own control link, unshaped.
        ctl_a, ctl_b = f"{self.tag}ca", f"{self.tag}cb"
        _sh("ip", "link", "add", ctl_a, "type", "veth", "peer", "name", ctl_b)
        _sh("ip", "link", "set", ctl_b, "netns", self.hub)
        _sh(*hub, "ip", "link", "set", ctl_b, "master", "br0")
        _sh(*hub, "ip", "link", "set", ctl_b, "up")
        _sh("ip", "addr", "add", f"{CONTROL_IP}/24", "dev", ctl_a)
        _sh("ip", "link", "set", ctl_a, "up")

    def teardown(self) -> None:
        subprocess.run(["ip", "link", "del", f"{self.tag}ca"], capture_output=True)
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", self.ns(node)], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)


def namespaces_available() -> str | None:
    """None if shaped namespaces can be built here, else why not."""
    probe = ShapedNamespaces(["probe"], 100, tag="scprobe")
    try:
        probe.setup()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return f"network namespaces or tc unavailable: {detail.strip()[:200]}"
    finally:
        probe.teardown()
    return None
