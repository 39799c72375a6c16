"""JSON from strangers, parsed with a size cap and a nesting limit checked before any recursion.

Python's `json` recurses once per nesting level. eth-account imports py_ecc, which raises the
interpreter's recursion limit to 100000, so in any of our processes a body of a few hundred
thousand `[` overflows the C stack (SIGSEGV) instead of raising RecursionError. The depth check
below works without recursion and in C-speed passes, so it is safe to run first on any input.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 32
"""Deepest nesting any of our messages needs, with room to spare (a submission is about 5)."""

# Strings (escapes included) hold no structure; the unrolled form keeps the regex linear and fast.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Depth ignores the bracket kind (a mismatch is the parser's to report), so both become [].
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


class UntrustedJSONError(ValueError):
    """The input is too large, nested too deeply, or not JSON; the message says which."""


def nesting_within(data: bytes, max_depth: int = MAX_DEPTH) -> bool:
    """True if every bracket in `data` (outside strings) is closed within `max_depth` levels.

    Each pass deletes the innermost pairs, so the brackets are gone after exactly `depth` passes;
    anything left after `max_depth` passes, or a pass that deletes nothing, means deeper or
    unbalanced. Unbalanced input counts as too deep on purpose: the standard parser recurses into
    every unclosed `[` before it notices the error. Cost: at most `max_depth` C-speed passes over
    the brackets alone (under 0.5 s for 4 MiB of brackets, less than parsing them would take).
    """
    brackets = _STRING.sub(b"", data).translate(_ONE_KIND, _NOT_A_BRACKET)
    for _ in range(max_depth):
        if not brackets:
            return True
        before = len(brackets)
        brackets = brackets.replace(b"[]", b"")
        if len(brackets) == before:
            return False
    return not brackets


def loads(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` for untrusted input: refuses what is over `max_bytes` or `max_depth`."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise UntrustedJSONError(f"JSON of {len(raw)} bytes is over the {max_bytes}-byte cap")
    if not nesting_within(raw, max_depth):
        raise UntrustedJSONError(f"JSON nested deeper than {max_depth} levels (or unbalanced)")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UntrustedJSONError(f"not JSON: {exc}") from None
