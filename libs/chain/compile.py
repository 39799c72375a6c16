"""Compile the Vyper sources in `protocol/contracts/` into committed JSON artifacts.

The artifacts are committed so that services and images need no compiler at run time; a unit
test recompiles and compares, so a source edit without `prime-chain compile` is caught.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .artifacts import BUILD_DIR, CONTRACTS_DIR, artifact_path
from .files import atomic_write_text


def source_paths(contracts_dir: Path = CONTRACTS_DIR) -> list[Path]:
    return sorted(contracts_dir.glob("*.vy"))


def compile_source(path: Path) -> dict[str, Any]:
    """Compile one contract; the result is what `<Name>.json` holds."""
    import vyper  # heavy import (~1 s); only the compile path pays for it

    # Settings (EVM version, optimizer) are pinned by pragmas in the source, so the bytecode
    # depends on the source and the pinned compiler alone.
    out = vyper.compile_code(
        path.read_text(), contract_path=path.name, output_formats=["abi", "bytecode"]
    )
    return {
        "contract_name": path.stem,
        "compiler": f"vyper {vyper.__version__}",
        "abi": out["abi"],
        "bytecode": out["bytecode"],
    }


def render(artifact: dict[str, Any]) -> str:
    # Stable text so a fresh compile can be compared byte for byte with the committed file.
    return json.dumps(artifact, indent=2, sort_keys=True) + "\n"


def compile_all(contracts_dir: Path = CONTRACTS_DIR) -> dict[str, str]:
    """Compile every source; returns {contract name: rendered artifact} without writing."""
    return {p.stem: render(compile_source(p)) for p in source_paths(contracts_dir)}


def write_artifacts(contracts_dir: Path = CONTRACTS_DIR, build_dir: Path = BUILD_DIR) -> list[Path]:
    build_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in compile_all(contracts_dir).items():
        path = artifact_path(name, build_dir)
        atomic_write_text(path, text)
        written.append(path)
    return written


def stale_artifacts(contracts_dir: Path = CONTRACTS_DIR, build_dir: Path = BUILD_DIR) -> list[str]:
    """Names whose committed artifact is missing or differs from a fresh compile."""
    stale = []
    for name, text in compile_all(contracts_dir).items():
        path = artifact_path(name, build_dir)
        if not path.exists() or path.read_text() != text:
            stale.append(name)
    return stale
