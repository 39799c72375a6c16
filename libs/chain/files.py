"""Atomic file writes: a reader never sees a half-written artifact, deployment or key file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _write_temp(path: Path, text: str, mode: int) -> str:
    """Write `text` to a fsynced temp file beside `path` with `mode`; returns its name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        # mkstemp creates the file 0600, so a secret is never readable by others, even briefly.
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` in one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, text, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def create_exclusive(path: Path, text: str, mode: int = 0o600) -> bool:
    """Create `path` holding `text` unless it exists; False if someone else created it first.

    Linking the finished temp file into place fails if the name is taken, so two processes
    racing to create the same key file never overwrite each other.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temp(path, text, mode)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
