"""Where each process of a local pool runs, and how the others reach it.

`OnThisMachine` is `make up`: every process on this machine's loopback, each on a free port.
`OnTestbed` puts each process on a host of a wide-area testbed (deploy/testbed): started inside
the host's network namespace, bound to all of its interfaces on the service's usual port, and
reached by everyone through the testbed's route to that port (the link emulator adds the round
trip between the two regions). The pool's bring-up (network.py) asks only this interface, so
the same code starts a pool on loopback and across regions.
"""

from __future__ import annotations

from typing import Protocol

from prime_swarm.deploy.testbed.net import LiveTestbed
from prime_swarm.libs.localnet.ports import free_port

# A testbed host is a machine of its own: every service listens on its usual port.
PORTS = {"redis": 6379, "anvil": 8545, "orchestrator": 8000, "origin": 8700, "relay": 8700}


def kind(process: str) -> str:
    """`relay-eu` -> relay, `worker-3` -> worker: what a process is, whatever its index."""
    return process.split("-", 1)[0]


class Placement(Protocol):
    def relays(self) -> list[str]:
        """Names of the relay processes (one per region on a testbed)."""
        ...

    def port(self, process: str) -> int:
        """The port `process` listens on."""
        ...

    def bind(self, process: str) -> str:
        """The interface `process` binds."""
        ...

    def address(self, process: str) -> tuple[str, int]:
        """Where every other process (and the launcher) reaches `process`'s port."""
        ...

    def argv(self, process: str, argv: list[str]) -> list[str]:
        """`argv` as started where `process` runs."""
        ...


class OnThisMachine:
    def __init__(self) -> None:
        self._ports: dict[str, int] = {}

    def relays(self) -> list[str]:
        return ["relay"]

    def port(self, process: str) -> int:
        return self._ports.setdefault(process, free_port())

    def bind(self, process: str) -> str:
        return "127.0.0.1"

    def address(self, process: str) -> tuple[str, int]:
        return "127.0.0.1", self.port(process)

    def argv(self, process: str, argv: list[str]) -> list[str]:
        return argv


class OnTestbed:
    """`hosts` maps process names to testbed hosts; `workers` lists the hosts workers go to, in
    turn (worker-0 on the first, ...). Unnamed processes run on `hosts["operator"]`."""

    def __init__(self, live: LiveTestbed, hosts: dict[str, str], workers: list[str]) -> None:
        self.live, self.hosts, self.workers = live, hosts, workers

    def host(self, process: str) -> str:
        if process in self.hosts:
            return self.hosts[process]
        if kind(process) == "worker":
            return self.workers[int(process.rsplit("-", 1)[1]) % len(self.workers)]
        return self.hosts["operator"]

    def relays(self) -> list[str]:
        return sorted(p for p in self.hosts if kind(p) == "relay")

    def port(self, process: str) -> int:
        return PORTS[kind(process)]

    def bind(self, process: str) -> str:
        return "0.0.0.0"  # inside the host's own namespace

    def address(self, process: str) -> tuple[str, int]:
        return self.live.addr(self.host(process), self.port(process))

    def argv(self, process: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.live.ns(self.host(process)), *argv]


def url(placement: Placement, process: str, scheme: str = "http") -> str:
    host, port = placement.address(process)
    return f"{scheme}://{host}:{port}"
