"""ASGI middleware that bounds what a request body can cost before any route sees it.

FastAPI reads a body whole and hands JSON to the standard parser. Capping on `Content-Length`
alone lets a chunked body of any size through, and the parser recurses once per nesting level (see
`untrusted_json`). This middleware counts the bytes actually received, stops reading at the cap,
checks the content type and the JSON nesting, and only then replays the body to the app.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .untrusted_json import MAX_DEPTH, nesting_within


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def refusal(status: int, reason: str, message: str) -> JSONResponse:
    """The error shape every route of ours uses: `{"detail": {"reason", "message"}}`."""
    return JSONResponse({"detail": {"reason": reason, "message": message}}, status_code=status)


class _BodyRefused(Exception):
    def __init__(self, response: JSONResponse) -> None:
        self.response = response


class BodyGuard:
    """Refuse bodies over `max_bytes` (413), non-JSON bodies when `json_only` (415), and JSON
    nested deeper than `max_depth` or unbalanced (400), whatever the framing."""

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, max_depth: int = MAX_DEPTH, json_only: bool = False
    ) -> None:
        self.app, self.max_bytes, self.max_depth, self.json_only = (
            app,
            max_bytes,
            max_depth,
            json_only,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = await self._read(headers, receive)
            self._check(headers, body)
        except _BodyRefused as refused:
            await refused.response(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as usual

        await self.app(scope, replay, send)

    async def _read(self, headers: dict[str, str], receive: Receive) -> bytes:
        too_large = _BodyRefused(
            refusal(413, "too_large", f"request body over {self.max_bytes} bytes")
        )
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            raise too_large
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:  # stop reading: the rest is never buffered
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _check(self, headers: dict[str, str], body: bytes) -> None:
        if not body:
            return
        content_type = headers.get("content-type", "")
        if self.json_only and not is_json_type(content_type):
            raise _BodyRefused(
                refusal(
                    415,
                    "unsupported_media_type",
                    f"send application/json, not {content_type[:64] or 'no content type'}",
                )
            )
        if (not content_type or is_json_type(content_type)) and not nesting_within(
            body, self.max_depth
        ):
            raise _BodyRefused(
                refusal(
                    400,
                    "malformed",
                    f"JSON nested deeper than {self.max_depth} levels, or unbalanced",
                )
            )
