"""Signed HTTP client of the orchestrator, with timeouts and a retry budget."""

from __future__ import annotations

import logging
import threading
from typing import TypeVar

import httpx
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ValidationError

from prime_swarm.libs.guard import untrusted_json
from prime_swarm.protocol.messages import (
    Heartbeat,
    HeartbeatReply,
    LeaseReply,
    LeaseRequest,
    PoolRequirements,
    RegisterReply,
    RegisterRequest,
    RolloutSubmission,
    SubmissionBatch,
    SubmitBatchReply,
    SubmitReply,
    WorkerStatusReply,
)
from prime_swarm.protocol.signing import WorkerAuth

log = logging.getLogger("worker.client")
# Replies are a few KiB; an orchestrator is not trusted to keep them small.
MAX_REPLY_BYTES = 4 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
MAX_SHOWN = 500
R = TypeVar("R", bound=BaseModel)


class OrchestratorError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def transient(self) -> bool:
        """Worth waiting out: the orchestrator or what it depends on is down or overloaded."""
        return self.status >= 500 or self.status == 429 and self.reason != "too_many_leases"


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


def _error(status: int, raw: bytes) -> OrchestratorError:
    """The orchestrator's `{"detail": {"reason", "message"}}`, parsed as untrusted input."""
    try:
        detail = untrusted_json.loads(raw, max_bytes=MAX_ERROR_BYTES).get("detail", {})
    except (untrusted_json.UntrustedJSONError, AttributeError):
        detail = raw[:MAX_SHOWN].decode(errors="replace")
    if isinstance(detail, dict):
        return OrchestratorError(
            status,
            str(detail.get("reason", "error"))[:MAX_SHOWN],
            str(detail.get("message", detail))[:MAX_SHOWN],
        )
    return OrchestratorError(
        status, "server_error" if status >= 500 else "error", str(detail)[:MAX_SHOWN]
    )


class OrchestratorClient:
    def __init__(
        self,
        base_url: str,
        account: LocalAccount,
        timeout_s: float,
        retry_budget: int,
        stop: threading.Event | None = None,
    ) -> None:
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), auth=WorkerAuth(account), timeout=timeout_s
        )
        self.retry_budget = retry_budget
        self.stop = stop or threading.Event()
        """Once set (the worker is stopping), a failing request is retried once, not for the
        whole budget: a stopping pool's orchestrator stops too, and waiting out its backoff
        (15 s of it) kept a worker from exiting long after everything else had."""

    def _request(self, method: str, path: str, body: BaseModel | None, reply: type[R]) -> R:
        content = body.model_dump_json().encode() if body is not None else None
        attempt = 0
        while True:
            delay = min(8.0, 0.25 * 2 ** (attempt + 1))
            try:
                # Each attempt is signed afresh (new nonce and timestamp) by WorkerAuth.
                status, raw, retry_after = self._send(method, path, content)
                if status == 429 and retry_after is not None:
                    err: Exception = _error(status, raw)
                    delay = min(30.0, max(delay, retry_after))
                elif status < 500:
                    break
                else:
                    err = _error(status, raw)
            except httpx.TransportError as exc:
                err = exc
            attempt += 1
            if attempt > (min(1, self.retry_budget) if self.stop.is_set() else self.retry_budget):
                raise err
            log.warning("retrying %s in %.1fs after %s", path, delay, err)
            self.stop.wait(delay)
        if status >= 400:
            raise _error(status, raw)
        try:
            return reply.model_validate_json(raw)
        except ValidationError as exc:
            raise OrchestratorError(
                status, "bad_reply", f"the orchestrator's reply to {path} is not a {reply.__name__}"
            ) from exc

    def _send(
        self, method: str, path: str, content: bytes | None
    ) -> tuple[int, bytes, float | None]:
        """Status, body (read up to MAX_REPLY_BYTES, whatever the framing) and Retry-After."""
        headers = {"content-type": "application/json"} if content is not None else None
        with self.http.stream(method, path, content=content, headers=headers) as resp:
            raw = bytearray()
            for chunk in resp.iter_bytes():
                raw += chunk
                if len(raw) > MAX_REPLY_BYTES:
                    raise OrchestratorError(
                        resp.status_code, "reply_too_large", f"reply over {MAX_REPLY_BYTES} bytes"
                    )
            return resp.status_code, bytes(raw), _retry_after(resp.headers.get("retry-after"))

    def register(self, req: RegisterRequest) -> RegisterReply:
        return self._request("POST", "/v1/register", req, RegisterReply)

    def heartbeat(self, req: Heartbeat) -> HeartbeatReply:
        return self._request("POST", "/v1/heartbeat", req, HeartbeatReply)

    def lease(self, req: LeaseRequest) -> LeaseReply:
        return self._request("POST", "/v1/lease", req, LeaseReply)

    def submit(self, sub: RolloutSubmission) -> SubmitReply:
        return self._request("POST", "/v1/submit", sub, SubmitReply)

    def submit_batch(self, batch: SubmissionBatch) -> SubmitBatchReply:
        return self._request("POST", "/v1/submit/batch", batch, SubmitBatchReply)

    def requirements(self) -> PoolRequirements:
        """What a machine must run to work for the pool (unsigned, read before staking)."""
        return self._request("GET", "/v1/requirements", None, PoolRequirements)

    def worker_status(self, address: str) -> WorkerStatusReply:
        """The pool's view of `address`: verdicts, units, throughput (unsigned, read-only)."""
        return self._request("GET", f"/v1/status/workers/{address}", None, WorkerStatusReply)

    def close(self) -> None:
        self.http.close()
