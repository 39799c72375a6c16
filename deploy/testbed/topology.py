"""A testbed described as data: regions, the round trips between them, hosts and their links,
and the faults to inject. One TOML file says it all; `Testbed.load` checks it and expands host
groups (`count = 22`) into hosts with names, namespaces and addresses.

    name = "three-regions"
    [regions.operator]           # rtt_ms/jitter_ms: between two hosts of the same region
    rtt_ms = 1
    [[links]]                    # between regions (symmetric)
    between = ["operator", "eu"]
    rtt_ms = 90
    jitter_ms = 8
    [hosts.origin]
    region = "operator"
    up_mbit = 1000
    down_mbit = 1000
    ports = [8700]               # what the host serves; each gets a route through the links
    [hosts.follower-eu]
    region = "eu"
    count = 22                   # follower-eu-1 .. follower-eu-22
    up_mbit = 10
    down_mbit = 25
    [[faults]]
    at_s = 30
    kind = "cut"                 # kill (a host's processes) | cut (a region, for_s) | reset
    region = "eu"
    for_s = 60
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Namespace and interface names carry the tag; Linux caps interface names at 15 characters.
MAX_TAG = 6
MAX_HOSTS = 250 * 250


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Region(_Strict):
    rtt_ms: float = Field(ge=0, le=10_000, description="Round trip between two of its hosts.")
    jitter_ms: float = Field(default=0.0, ge=0, le=10_000)


class RegionLink(_Strict):
    between: tuple[str, str]
    rtt_ms: float = Field(ge=0, le=10_000)
    jitter_ms: float = Field(default=0.0, ge=0, le=10_000)


class HostSpec(_Strict):
    region: str
    up_mbit: float = Field(gt=0, le=100_000)
    down_mbit: float = Field(gt=0, le=100_000)
    count: int = Field(default=1, ge=1, le=1000, description="More than 1: a group, name-1..N.")
    ports: list[int] = Field(default_factory=list, description="TCP ports the host serves.")


class Fault(_Strict):
    at_s: float = Field(ge=0, description="Seconds after the schedule starts.")
    kind: Literal["kill", "cut", "reset"]
    host: str | None = Field(default=None, description="kill: the host whose processes die.")
    region: str | None = Field(default=None, description="cut, reset: the region (reset: all).")
    for_s: float | None = Field(default=None, gt=0, description="cut: until it heals.")

    @model_validator(mode="after")
    def _complete(self) -> Fault:
        if self.kind == "kill" and not self.host:
            raise ValueError("a kill fault names its host")
        if self.kind == "cut" and not (self.region and self.for_s):
            raise ValueError("a cut fault names its region and for_s")
        return self


class Host(_Strict):
    """One expanded host: its own network namespace, address and shaped link."""

    name: str
    group: str
    region: str
    up_mbit: float
    down_mbit: float
    ports: tuple[int, ...]
    index: int

    def ip(self, subnet: str) -> str:
        return f"{subnet}.{self.index // 250}.{self.index % 250 + 1}"


class Testbed(_Strict):
    __test__ = False  # not a pytest class, whatever its name

    name: str
    tag: str = Field(default="wan", pattern=r"^[a-z][a-z0-9]*$", max_length=MAX_TAG)
    subnet: str = Field(default="10.78", pattern=r"^10\.\d{1,3}$", description="A 10.x/16.")
    window_bytes: int = Field(default=4 << 20, ge=16 << 10, description="In flight per flow.")
    regions: dict[str, Region]
    links: list[RegionLink] = Field(default_factory=list)
    hosts: dict[str, HostSpec]
    faults: list[Fault] = Field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Testbed:
        return cls.model_validate(tomllib.loads(Path(path).read_text()))

    @model_validator(mode="after")
    def _consistent(self) -> Testbed:
        names = set(self.regions)
        for link in self.links:
            unknown = set(link.between) - names
            if unknown:
                raise ValueError(f"link {link.between} names unknown region(s) {sorted(unknown)}")
        for a, b in itertools.combinations(sorted(names), 2):
            if self._link(a, b) is None:
                raise ValueError(f"no link between regions {a!r} and {b!r}")
        for name, spec in self.hosts.items():
            if spec.region not in names:
                raise ValueError(f"host {name!r} is in unknown region {spec.region!r}")
        if sum(s.count for s in self.hosts.values()) > MAX_HOSTS:
            raise ValueError(f"more than {MAX_HOSTS} hosts")
        hosts = {h.name for h in self.expand()}
        for f in self.faults:
            if f.host and f.host not in hosts:
                raise ValueError(f"fault at {f.at_s}s names unknown host {f.host!r}")
            if f.region and f.region not in names:
                raise ValueError(f"fault at {f.at_s}s names unknown region {f.region!r}")
        return self

    def _link(self, a: str, b: str) -> RegionLink | None:
        return next((k for k in self.links if set(k.between) == {a, b}), None)

    def rtt(self, a: str, b: str) -> tuple[float, float]:
        """(round trip, jitter) in milliseconds between a host of region a and one of b."""
        if a == b:
            r = self.regions[a]
            return r.rtt_ms, r.jitter_ms
        link = self._link(a, b)
        assert link is not None  # _consistent checked every pair
        return link.rtt_ms, link.jitter_ms

    def expand(self) -> list[Host]:
        """Every host, groups expanded (`follower-eu` with count 3: follower-eu-1..3)."""
        out: list[Host] = []
        for group, spec in self.hosts.items():
            names = (
                [group] if spec.count == 1 else [f"{group}-{i}" for i in range(1, spec.count + 1)]
            )
            for name in names:
                out.append(
                    Host(
                        name=name,
                        group=group,
                        region=spec.region,
                        up_mbit=spec.up_mbit,
                        down_mbit=spec.down_mbit,
                        ports=tuple(spec.ports),
                        index=len(out),
                    )
                )
        return out
