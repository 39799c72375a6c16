"""Load the committed contract artifacts (ABI + bytecode) from `protocol/contracts/build`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from prime_swarm.protocol import contracts as _contracts_pkg

from .errors import ChainError

# Sources and artifacts live in protocol/ because they are part of the wire contract (DESIGN §4).
CONTRACTS_DIR = Path(_contracts_pkg.__file__).resolve().parent
BUILD_DIR = CONTRACTS_DIR / "build"
LEDGER_CONTRACT = "SwarmLedger"


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    compiler: str


def artifact_path(name: str, build_dir: Path = BUILD_DIR) -> Path:
    return build_dir / f"{name}.json"


@cache
def load_artifact(name: str = LEDGER_CONTRACT, build_dir: Path = BUILD_DIR) -> Artifact:
    path = artifact_path(name, build_dir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChainError(f"no artifact {path}; run `prime-chain compile`") from None
    except json.JSONDecodeError as exc:
        raise ChainError(f"artifact {path} is not valid JSON: {exc}") from None
    return Artifact(
        name=data["contract_name"],
        abi=data["abi"],
        bytecode=data["bytecode"],
        compiler=data["compiler"],
    )
