"""Seeded Gumbel noise for replayable sampling: a pure function of (seed, sample, position,
token), the same bits on every device.

A worker samples token k of completion i as argmax(logits / T + g) with g = noise(seed, i, k);
a validator regenerates g and checks each submitted token against recomputed logits.

How the bits stay identical everywhere without costing a decode step: transcendental functions
(`log`) are not correctly rounded and differ between CPU and CUDA libraries, and hashing every
(row, token) pair with integer ops costs more than the LM head at a 150k vocabulary. So the noise
comes from one fixed table of NOISE_TABLE_SIZE standard Gumbel values, built once per process on
the CPU with integer hashing and IEEE-exact arithmetic only (a log written with +, -, *, / that
every IEEE-754 machine rounds alike), then copied to the device. A row (seed, sample, position)
reads the contiguous window that starts at a hashed offset: token t gets
table[(offset + t) mod NOISE_TABLE_SIZE]. On the device that is a slice and a copy, on the order
of a memcpy of the logits (bench/noise measures it against a decode step).

Within a row the values are distinct table entries (windows are shorter than the table), so the
argmax is a Gumbel-max sample; two rows share values only where their windows overlap, shifted
against each other, which does not correlate which token wins. The extreme tail is cut at the
table's largest value (about 16.6): a token whose tempered logit trails the best by more than
about 19 is never sampled (probability < 1e-8 under exact sampling).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import torch

NOISE_TABLE_SIZE = 1 << 22
"""Entries in the shared Gumbel table (16 MiB as float32)."""
MAX_VOCAB = 1 << 20
"""Largest vocabulary the noise serves: windows must stay shorter than the table."""
_TABLE_KEY = 0x5052494D455F5357  # "PRIME_SW": fixes the table for every pool, forever
_LN2 = 0.6931471805599453
_LOCK = threading.Lock()
_TABLES: dict[torch.device, torch.Tensor] = {}
_U64 = np.uint64


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def exact_log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive finite float64 values using only IEEE-exact operations.

    x = m * 2**e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.18,
    summed to s**21 (truncation < 1e-17). Every step is a correctly rounded +, -, *, /, so any
    IEEE-754 machine produces the same bits, unlike libm's log.
    """
    bits = x.view(np.int64)
    e = ((bits >> 52) & 0x7FF) - 1023
    m = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(np.float64)
    big = m > 1.4142135623730951
    m = np.where(big, m * 0.5, m)
    e = e + big
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    acc = np.zeros_like(s)
    for k in range(21, 0, -2):
        acc = acc * s2 + 1.0 / k
    return e.astype(np.float64) * _LN2 + 2.0 * s * acc


def build_table(size: int = NOISE_TABLE_SIZE) -> np.ndarray:
    """The Gumbel table as float32: -log(-log(u_i)), u_i from splitmix64(key + i)."""
    raw = _splitmix64(np.arange(size, dtype=np.uint64) + _U64(_TABLE_KEY))
    u = ((raw >> _U64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # strictly inside (0, 1)
    return (-exact_log(-exact_log(u))).astype(np.float32)


def _table(device: torch.device) -> torch.Tensor:
    """The table on `device`, with its first MAX_VOCAB entries repeated at the end so that every
    window is one contiguous slice."""
    with _LOCK:
        if device not in _TABLES:
            cpu = _TABLES.get(torch.device("cpu"))
            if cpu is None:
                base = torch.from_numpy(build_table())
                cpu = torch.cat([base, base[:MAX_VOCAB]])
                _TABLES[torch.device("cpu")] = cpu
            _TABLES[device] = cpu.to(device)
        return _TABLES[device]


def row_offset(seed: int, sample_index: int, position: int) -> int:
    """Where the window of (seed, sample, position) starts: sha256, so it is the same integer in
    every language and on every platform."""
    if not 0 <= seed < 1 << 128:
        raise ValueError("seed must be in [0, 2**128)")
    if sample_index < 0 or position < 0:
        raise ValueError("sample_index and position must be >= 0")
    digest = hashlib.sha256(f"prime-swarm/gumbel/v2:{seed}:{sample_index}:{position}".encode())
    return int.from_bytes(digest.digest()[:8], "little") % NOISE_TABLE_SIZE


def gumbel_rows(
    rows: list[tuple[int, int, int]], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Noise [len(rows), vocab_size] (float32, on `device`) for rows of (seed, sample, position)."""
    if not 0 < vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size must be in (0, {MAX_VOCAB}]")
    table = _table(torch.device(device))
    if not rows:
        return torch.empty((0, vocab_size), dtype=torch.float32, device=table.device)
    return torch.stack([table[o : o + vocab_size] for o in (row_offset(*r) for r in rows)])


def perturbed_scores(
    logits: torch.Tensor, temperature: float, noise: torch.Tensor | None
) -> torch.Tensor:
    """logits / T + noise; the plain logits when T == 0 (greedy, no noise needed). Ties go to
    the lowest id."""
    if temperature <= 0:
        return logits.float()
    if noise is None:
        raise ValueError("sampling at T > 0 needs noise")
    return logits.float() / temperature + noise
