"""A non-editable install (the Docker images) ships exactly the packages listed in pyproject."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_python_package_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {"prime_swarm"} | {
        "prime_swarm." + ".".join(p.parent.relative_to(REPO).parts)
        for top in ("protocol", "libs", "services", "deploy")
        for p in (REPO / top).rglob("__init__.py")
    }
    assert found == listed


def test_torch_is_pinned_exactly_wherever_it_is_required() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    torch_reqs = [r for reqs in extras.values() for r in reqs if r.startswith("torch")]
    assert torch_reqs and all(r.startswith("torch==") for r in torch_reqs)


def test_the_status_page_is_package_data() -> None:
    """The orchestrator reads static/status.html at start-up: a non-editable install needs it."""
    package = "prime_swarm.services.orchestrator"
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ][package]
    root = REPO / "services" / "orchestrator"
    files = [p.relative_to(root) for p in (root / "static").iterdir() if p.is_file()]
    assert files and all(any(f.match(pat) for pat in patterns) for f in files), files
