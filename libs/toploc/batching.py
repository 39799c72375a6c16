"""Gather chunks of many completions into bounded, same-shape slabs for vectorized work.

Chunks of equal size (tokens x hidden) and equal k can share one top-k call and one interpolation
or evaluation, whatever completion they come from; slabs are capped in size so memory stays
bounded however many completions arrive at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from .bits import ChunkLayout

SLAB_ELEMENTS = 1 << 23
"""Hidden-state elements per slab: 64 MiB once widened to int64, at least one chunk."""


@dataclass
class Run:
    """Consecutive chunks of one completion that share a shape."""

    item: int
    first_chunk: int
    rows: torch.Tensor  # [count, tokens * hidden] bf16
    k: int
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # leading dim = count


@dataclass
class Slab:
    rows: torch.Tensor  # [r, n] bf16
    k: int
    items: np.ndarray  # [r] which completion each row belongs to
    chunks: np.ndarray  # [r] chunk index within that completion
    extras: dict[str, np.ndarray]


def runs_for(item: int, hidden: torch.Tensor, layout: ChunkLayout) -> list[Run]:
    """Split one completion's bf16 hidden states ([L, C]) into runs of chunk rows."""
    out = []
    for first, count, k in layout.runs():
        start = first * layout.chunk_size
        stop = min(start + count * layout.chunk_size, layout.n_tokens)
        rows = hidden[start:stop].reshape(count, -1)
        out.append(Run(item, first, rows, k))
    return out


def slabs(runs: list[Run]) -> Iterator[Slab]:
    """Yield slabs of rows that share (row length, k), each at most SLAB_ELEMENTS large."""
    groups: dict[tuple[int, int], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.rows.shape[1], run.k)].append(run)
    for (n, k), members in groups.items():
        per_slab = max(1, SLAB_ELEMENTS // max(n, 1))
        pieces: list[tuple[Run, int, int]] = []
        filled = 0
        for run in members:
            start = 0
            while start < run.rows.shape[0]:
                take = min(run.rows.shape[0] - start, per_slab - filled)
                pieces.append((run, start, start + take))
                filled += take
                start += take
                if filled == per_slab:
                    yield _assemble(pieces, k)
                    pieces, filled = [], 0
        if pieces:
            yield _assemble(pieces, k)


def _assemble(pieces: list[tuple[Run, int, int]], k: int) -> Slab:
    rows = torch.cat([run.rows[a:b] for run, a, b in pieces]) if len(pieces) > 1 else None
    if rows is None:
        run, a, b = pieces[0]
        rows = run.rows[a:b]
    items = np.concatenate([np.full(b - a, run.item, dtype=np.int64) for run, a, b in pieces])
    chunks = np.concatenate(
        [np.arange(a, b, dtype=np.int64) + run.first_chunk for run, a, b in pieces]
    )
    extras = {
        name: np.concatenate([run.extras[name][a:b] for run, a, b in pieces])
        for name in pieces[0][0].extras
    }
    return Slab(rows, k, items, chunks, extras)
