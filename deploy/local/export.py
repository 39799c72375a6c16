"""`prime-swarm export`: a trainer version out of a run, as a Hugging Face directory, checked.

The writing and the check are libs/model/export.py; this picks the version from the run's
checkpoints, turns refusals into one line naming the flag, and prints one line of result.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

DTYPES = ("bf16", "fp32")


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ValueError(v)
    return n


# argparse names a failed `type=` by its __name__: "invalid positive integer value: '0'".
_positive.__name__ = "positive integer"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoints",
        type=Path,
        default=Path("runs/latest/checkpoints"),
        help="the run's checkpoints folder (default: runs/latest/checkpoints)",
    )
    p.add_argument("--version", type=int, help="policy version (default: the newest saved)")
    p.add_argument("--out", type=Path, required=True, help="the model directory to write")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="weights' dtype (default fp32)")
    p.add_argument("--force", action="store_true", help="replace an existing model directory")
    p.add_argument(
        "--heldout",
        type=_positive,
        metavar="N",
        help="also measure the export's greedy held-out reward on N tasks of the recipe's "
        "environments (PRIME_UP_* / PRIME_RECIPE_* variables, as `prime-swarm up` evaluates)",
    )
    p.add_argument(
        "--check-vllm",
        action="store_true",
        help="also load the export with vLLM's LLM(model=OUT) and compare its greedy tokens",
    )


def source_dir(checkpoints: Path, version: int | None, fail: Callable[[str], NoReturn]) -> Path:
    """The master weights of `version` (default the newest) in a run's checkpoints folder."""
    from prime_swarm.libs.rl.checkpoint import model_dir, saved_versions

    if not checkpoints.is_dir():
        fail(f"--checkpoints: {checkpoints} is not a folder")
    versions = saved_versions(checkpoints)
    if not versions:
        fail(f"--checkpoints: {checkpoints} holds no saved version (v<N>/model)")
    if version is None:
        version = versions[-1]
    elif version not in versions:
        fail(f"--version: {version} is not saved in {checkpoints} (saved: {_span(versions)})")
    return model_dir(checkpoints, version)


def _span(versions: list[int]) -> str:
    shown = [str(v) for v in versions[-8:]]
    return ", ".join(["...", *shown] if len(versions) > 8 else shown)


def run(
    args: argparse.Namespace,
    fail: Callable[[str], NoReturn],
    heldout: Callable[[Path, int], float],
) -> None:
    """`heldout(model_dir, n)`: the held-out reward `prime-swarm up` reports, on n tasks."""
    from prime_swarm.libs.model.causal_lm import PRECISIONS
    from prime_swarm.libs.model.export import (
        NEAR_TIE,
        ExportError,
        check_export,
        export_model,
        vllm_greedy,
    )
    from prime_swarm.libs.model.io import ModelDirError
    from prime_swarm.libs.model.vllm_backend import VLLMBackendError, import_vllm

    source = source_dir(args.checkpoints, args.version, fail)
    if args.check_vllm:
        try:
            import_vllm()  # before anything is written: a missing vLLM is a refused flag
        except VLLMBackendError as exc:
            fail(f"--check-vllm: {exc}")
    dtype = PRECISIONS[args.dtype]
    try:
        out = export_model(source, args.out, dtype, force=args.force)
    except ExportError as exc:
        fail(f"--out: {exc}")
    except (ModelDirError, OSError) as exc:
        fail(f"--checkpoints: {source}: {exc}")
    files = sorted(p.name for p in out.iterdir())
    line = f"exported {source} ({args.dtype}) to {out}: {', '.join(files)}; plain transformers: "
    try:
        check = check_export(source, out, dtype)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # what a failed load raises
        print(line + f"check FAILED: {type(exc).__name__}: {exc}".splitlines()[0])
        sys.exit(1)
    if not check.ok:
        print(line + "check FAILED: " + "; ".join(check.problems()))
        sys.exit(1)
    line += (
        f"greedy {len(check.tokens)} tokens as the checkpoint, max |logit diff| "
        f"{check.max_logit_diff:.2g} <= {check.tolerance:g}"
        + (", chat template kept" if check.has_chat_template else "")
    )
    failed = False
    if args.check_vllm:
        try:
            tokens = vllm_greedy(out, check.prompt_ids, len(check.reference_tokens))
            agrees = check.agrees_with(tokens, NEAR_TIE[dtype])
            line += f"; vLLM: greedy {'as the checkpoint' if agrees else 'FAILED, differs'}"
        except VLLMBackendError as exc:  # vLLM cannot load the export: the check failed
            agrees = False
            line += f"; vLLM: FAILED, {exc}".splitlines()[0]
        failed = not agrees
    if args.heldout:
        line += f"; held-out reward {heldout(out, args.heldout):.3f} on {args.heldout} tasks"
    print(line)
    if failed:
        sys.exit(1)
