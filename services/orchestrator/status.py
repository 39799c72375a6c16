"""The pool's public face: a read-only status API and the page that shows it.

Unsigned (anyone may look), rate limited per client IP, bounded (the workers list is capped),
and cheap (services/orchestrator/board.py). The page is one static file with inline script that
polls `/v1/status` and renders every worker-supplied string as text, never as markup; its
Content-Security-Policy allows that one script and style by hash, and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse

from prime_swarm.libs.guard.ratelimit import Limited
from prime_swarm.protocol.messages import PoolRequirements, PoolStatus, WorkerStatusReply

from .deps import PoolDep, rate_limited, refuse

router = APIRouter()
PAGE_FILE = "status.html"


async def count_client(request: Request, pool: PoolDep) -> None:
    """One request against the client IP's allowance of the status API (429 past it)."""
    route = "status"  # one allowance for every status route
    ip = request.client.host if request.client else "unknown"
    try:
        await pool.limiter.hit(f"{route}:{ip}", pool.settings.status_rate)
    except Limited as exc:
        raise rate_limited(route, exc) from None


StatusClient = Annotated[None, Depends(count_client)]
AddressPath = Annotated[
    str, Path(pattern=r"^0x[0-9a-fA-F]{40}$", description="The worker's address.")
]


@router.get("/v1/requirements", response_model=PoolRequirements, name="requirements")
async def requirements(pool: PoolDep, _: StatusClient) -> PoolRequirements:
    """What a machine must run to work for this pool: `prime-worker join` reads it before it
    stakes anything."""
    return pool.requirements


@router.get("/v1/status", response_model=PoolStatus, name="status")
async def status(pool: PoolDep, _: StatusClient) -> PoolStatus:
    return await pool.board.pool_status(pool.leases.in_flight)


@router.get(
    "/v1/status/workers/{address}",
    response_model=WorkerStatusReply,
    name="worker_status",
    responses={404: {"description": "The pool has never heard of this worker."}},
)
async def worker_status(address: AddressPath, pool: PoolDep, _: StatusClient) -> WorkerStatusReply:
    row = await pool.board.worker(address)
    if row is None:
        raise refuse("worker_status", 404, "this pool has never heard of that worker", "unknown")
    ann = await pool.policy.latest()
    return WorkerStatusReply(
        pool_id=pool.settings.pool_id, policy_version=ann.version if ann else None, worker=row
    )


def _csp_hashes(html: str, tag: str) -> str:
    """'sha256-…' sources of each inline <tag> block, for the Content-Security-Policy."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
    return " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'"
        for b in blocks
    )


def _page() -> tuple[str, dict[str, str]]:
    html = resources.files(__package__).joinpath("static", PAGE_FILE).read_text("utf-8")
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_csp_hashes(html, 'script')}",
            f"style-src {_csp_hashes(html, 'style')}",
            "connect-src 'self'",
            "img-src data:",  # the empty favicon, so the browser asks for no /favicon.ico
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return html, headers


PAGE, PAGE_HEADERS = _page()  # read once: a missing file stops start-up, not a page load


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
@router.get("/status", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(PAGE, headers=PAGE_HEADERS)
