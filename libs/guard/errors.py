"""Validation errors as a client may see them: what is wrong and where, never the input itself.

pydantic's error list carries the offending `input` (and `ctx`); echoing it back turns a 4 MiB
body into a 4 MiB reply, and bytes in it make the reply unserializable (a 500).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_ERRORS = 10
MAX_TEXT = 200
MAX_LOC_PARTS = 8


def public_errors(errors: Sequence[Any]) -> list[dict[str, object]]:
    """At most MAX_ERRORS entries of type, location and message, each cut to a bounded size."""
    out: list[dict[str, object]] = []
    for err in list(errors)[:MAX_ERRORS]:
        if not isinstance(err, dict):
            continue
        loc = err.get("loc", ())
        out.append(
            {
                "type": str(err.get("type", "invalid"))[:64],
                "loc": [p if isinstance(p, int) else str(p)[:64] for p in loc[:MAX_LOC_PARTS]],
                "msg": str(err.get("msg", ""))[:MAX_TEXT],
            }
        )
    return out


def install_validation_handler(app: FastAPI) -> None:
    """422 with bounded, input-free errors, in the `{"detail": {"reason", ...}}` shape."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {
                "detail": {
                    "reason": "malformed",
                    "message": "invalid request",
                    "errors": public_errors(exc.errors()),
                }
            },
            status_code=422,
        )
