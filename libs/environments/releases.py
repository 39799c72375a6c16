"""Which release of an environment this machine has: the version of the distribution that
installs it, and a hash of the source that defines it. A worker on another release than the
validators' produces other replies honestly, so a pool names the releases it accepts and a
worker declares its own (protocol/messages.py `EnvRelease`)."""

from __future__ import annotations

import hashlib
import inspect
import sys

from prime_swarm.libs.environments.registry import env_factory, installed
from prime_swarm.protocol.messages import EnvRelease


def env_release(name: str) -> EnvRelease:
    """`name` as installed here (EnvLoadError when it is not)."""
    factory = env_factory(name)
    module = sys.modules.get(getattr(factory, "__module__", ""), None)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):  # no source shipped (a compiled module): its name stands in
        source = getattr(module, "__name__", name)
    dist = installed()[name].dist
    return EnvRelease(
        env=name,
        version=dist.version if dist is not None else "0",
        content_hash=hashlib.sha256(source.encode()).hexdigest()[:16],
    )


def distribution_of(name: str) -> str:
    """The distribution that installs environment `name` (what a contributor pip-installs);
    the environment's own name when it is not installed here."""
    found = installed().get(name)
    dist = found.dist if found is not None else None
    return dist.metadata["Name"] if dist is not None else name
