"""Signed HTTP client of the orchestrator, with timeouts and a retry budget."""

from __future__ import annotations

import logging
import time
from typing import TypeVar

import httpx
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel

from prime_swarm.protocol.messages import (
    Heartbeat,
    HeartbeatReply,
    LeaseReply,
    LeaseRequest,
    RegisterReply,
    RegisterRequest,
    RolloutSubmission,
    SubmitReply,
)
from prime_swarm.protocol.signing import WorkerAuth

log = logging.getLogger("worker.client")
R = TypeVar("R", bound=BaseModel)


class OrchestratorError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class OrchestratorClient:
    def __init__(
        self, base_url: str, account: LocalAccount, timeout_s: float, retry_budget: int
    ) -> None:
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), auth=WorkerAuth(account), timeout=timeout_s
        )
        self.retry_budget = retry_budget

    def _post(self, path: str, body: BaseModel, reply: type[R]) -> R:
        content = body.model_dump_json().encode()
        attempt = 0
        while True:
            try:
                # Each attempt is signed afresh (new nonce and timestamp) by WorkerAuth.
                resp = self.http.post(
                    path, content=content, headers={"content-type": "application/json"}
                )
                if resp.status_code < 500:
                    break
                err: Exception = OrchestratorError(resp.status_code, "server_error", resp.text)
            except httpx.TransportError as exc:
                err = exc
            attempt += 1
            if attempt > self.retry_budget:
                raise err
            delay = min(8.0, 0.25 * 2**attempt)
            log.warning("retrying %s in %.1fs after %s", path, delay, err)
            time.sleep(delay)
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", {})
            except ValueError:
                detail = resp.text
            if isinstance(detail, dict):
                raise OrchestratorError(
                    resp.status_code,
                    str(detail.get("reason", "error")),
                    str(detail.get("message", detail)),
                )
            raise OrchestratorError(resp.status_code, "error", str(detail))
        return reply.model_validate_json(resp.content)

    def register(self, req: RegisterRequest) -> RegisterReply:
        return self._post("/v1/register", req, RegisterReply)

    def heartbeat(self, req: Heartbeat) -> HeartbeatReply:
        return self._post("/v1/heartbeat", req, HeartbeatReply)

    def lease(self, req: LeaseRequest) -> LeaseReply:
        return self._post("/v1/lease", req, LeaseReply)

    def submit(self, sub: RolloutSubmission) -> SubmitReply:
        return self._post("/v1/submit", sub, SubmitReply)

    def close(self) -> None:
        self.http.close()
