"""bench/results/toploc.json, written one way by every TOPLOC bench: strict JSON (a JSON reader
rejects Python's `Infinity` and `NaN`), so an unbounded statistic is written as the string
"inf" (an exponent mismatch makes the weight ratio infinite: states of another model)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by "inf", "-inf" or "nan"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def write_results(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(finite(doc), indent=1, allow_nan=False) + "\n")


_NON_FINITE = {"inf", "-inf", "nan"}


def _restored(value: Any) -> Any:
    if isinstance(value, str) and value in _NON_FINITE:
        return float(value)
    if isinstance(value, dict):
        return {k: _restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value


def read_results(path: Path) -> dict:
    """The results file with "inf", "-inf" and "nan" read back as floats ({} when absent)."""
    return _restored(json.loads(path.read_text())) if path.exists() else {}
