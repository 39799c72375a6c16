"""The fuzzing harness: schemathesis against orchestrator, origin and relay, each a real process.

Each service runs as its console script (`prime-orchestrator`, `prime-relay origin|relay`) on a
free 127.0.0.1 port, behind the same real Redis and anvil chain (with the ledger deployed, a pool
created and a worker staked) that the integration tests use. The schema is the one the process
serves at /openapi.json; cases generated from it (schemathesis, positive and negative) go over
real HTTP, and every response passes schemathesis' `not_a_server_error` check. After each
service's run the process must still be alive and answer /healthz: an exit is a crash. (A
process that cannot serve /openapi.json has that counted as a server error, and the run stops.)

Generated bodies alone would all stop at the front door, so every case also draws a plan:

- orchestrator: most cases are signed (EIP-191, `protocol/signing.py`) by a worker that is
  staked on chain and registered, with the body's `worker`/`pool_id` (and, for /v1/submit, a
  live `lease_id`) pointed at it, so they reach validation, identity, leases and admission.
  The rest are unsigned, signed by a key that is not the claimed one, signed over other bytes,
  carry stale, future or non-finite timestamps, or garbage headers; any 2xx among those is
  counted as `auth_bypass`. A few carry bodies no schema describes (deep nesting, over the
  body cap with and without Content-Length, bad UTF-8, other content types).
- origin: uploads are trusted through the trainer's signature on the manifest, so most PUTs of
  a manifest carry one signed by the trainer key for the generated version; others are forged,
  inconsistent or random bytes. Shard PUTs send the exact bytes of an accepted manifest, wrong
  bytes, too many bytes or random bytes.
- relay (and the origin's reads): a small real version is published through the origin first
  and pulled by the relay; GETs and HEADs hit its real shards as well as generated paths, with
  generated `Range` and `If-None-Match` headers.

Two runs share it, so it lives with the test helpers: `make fuzz` (bench/fuzz, 1000 cases a
service, bench/results/fuzz.json) and its 100-case pass in tests/integration/test_fuzz.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import secrets
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import hypothesis
import requests
import schemathesis
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from requests.auth import AuthBase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure

from prime_swarm.deploy.local.pool import (
    start_pool,
)
from prime_swarm.libs.localnet.ports import free_port
from prime_swarm.libs.localnet.process import ManagedProcess
from prime_swarm.libs.shardcast import publish_version, wait_for_version
from prime_swarm.protocol.manifest_signing import model_hash, sign_manifest
from prime_swarm.protocol.messages import (
    FileEntry,
    Manifest,
    ShardInfo,
    SignedManifest,
)
from prime_swarm.protocol.signing import (
    HEADER_ADDRESS,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    canonical_request,
)

# The one place for orchestrator settings of the fuzz run (PRIME_ORCH_* variables; others set in
# the caller's environment pass through). The fuzz worker sends hundreds of signed requests a
# second from one key, far over a real worker's limits: 429 is not a failure, but a run of 429s
# tests nothing past the limiter. So the limits are raised (the limiter still counts each
# request), and the chain lookup budget too, because outsiders' cases each cost a lookup.
_FUZZ_RATE = {"per_second": 10_000.0, "burst": 10_000}
MAX_BODY_BYTES = 4 * 1024 * 1024  # the orchestrator's body cap in these runs, set below
ORCHESTRATOR_ENV: dict[str, str] = {
    "PRIME_ORCH_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    "PRIME_ORCH_RATE_LIMITS": json.dumps(
        {route: _FUZZ_RATE for route in ("registration", "heartbeat", "lease", "submit")}
    ),
    "PRIME_ORCH_CHAIN_LOOKUP_RATE": json.dumps(_FUZZ_RATE),
}

POLICY_VERSION = 5  # announced before the run, so leases are issued and submissions admitted
SHARD_SIZE = 64 * 1024
REQUEST_TIMEOUT_S = 15.0
# `?wait=S` holds a shard request up to 30 s by design while the shard is in flight; capped here
# so a generated wait on a version still arriving costs a second, not the run's time budget.
MAX_WAIT_S = 1.0
MAX_FAILURE_EXAMPLES = 10
TRUNCATE = 400


# ---------------------------------------------------------------- processes


def console_script(name: str) -> str:
    """The venv's entry point next to this interpreter (what `make` installs), else PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found; run `make setup`")
    return found


@dataclass
class Target:
    """One running service under test and how to build its cases."""

    name: str
    url: str
    process: ManagedProcess
    planner: Planner

    def healthz(self) -> int | None:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code
        except httpx.HTTPError:
            return None


@dataclass
class OrchestratorStack:
    target: Target
    member: LocalAccount
    outsider: LocalAccount
    pool_id: int


@contextmanager
def orchestrator_stack(
    rpc_url: str, owner: LocalAccount, redis_url: str, work: Path
) -> Iterator[OrchestratorStack]:
    """Ledger deployed, pool created, a member staked and registered, a policy announced."""
    trainer, member, outsider = Account.create(), Account.create(), Account.create()
    with start_pool(
        work, rpc_url, redis_url, owner, trainer.address,
        members=[member], placeholder_version=POLICY_VERSION, timeout_s=60,
        env={"PRIME_ORCH_LOG_LEVEL": "WARNING", **ORCHESTRATOR_ENV},
    ) as pool:  # fmt: skip
        planner = OrchestratorPlanner(member, outsider, pool.pool_id)
        planner.prime(pool.url)
        assert pool.process is not None
        target = Target("orchestrator", pool.url, pool.process, planner)
        yield OrchestratorStack(target, member, outsider, pool.pool_id)


@dataclass
class ShardcastStack:
    origin: Target
    relay: Target
    trainer: LocalAccount


def _tiny_model(root: Path) -> dict[str, bytes]:
    """A small real version: a config, a tokenizer and ~3 weight shards with a ragged tail."""
    files = {
        "config.json": json.dumps({"model_type": "tiny", "name": "fuzz"}).encode(),
        "tokenizer.json": b'{"model": {"vocab": {"a": 0}}}',
        "model.safetensors": hashlib.sha256(b"fuzz").digest() * ((2 * SHARD_SIZE + 1000) // 32),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


@contextmanager
def shardcast_stack(work: Path) -> Iterator[ShardcastStack]:
    """An origin trusting a trainer key, version 1 published through it, a relay that holds it."""
    trainer = Account.create()
    files = _tiny_model(work / "model_v1")
    published = {1: files}
    started: list[ManagedProcess] = []
    try:
        origin_port, relay_port = free_port(), free_port()
        origin_url = f"http://127.0.0.1:{origin_port}"
        relay_url = f"http://127.0.0.1:{relay_port}"
        relay_cmd = console_script("prime-relay")
        origin = ManagedProcess(
            "origin",
            [relay_cmd, "origin", "--port", str(origin_port), "--data-dir", str(work / "origin")]
            + ["--trainer", trainer.address, "--log-level", "WARNING"],
            work,
        )
        started.append(origin)
        origin.wait_http(f"{origin_url}/healthz", timeout_s=30)
        publish_version(origin_url, work / "model_v1", 1, None, trainer, SHARD_SIZE, 10.0)
        relay = ManagedProcess(
            "relay",
            [relay_cmd, "relay", "--port", str(relay_port), "--data-dir", str(work / "relay")]
            + ["--trainer", trainer.address, "--parent", origin_url, "--poll-interval", "0.2"]
            + ["--log-level", "WARNING"],
            work,
        )
        started.append(relay)
        relay.wait_http(f"{relay_url}/healthz", timeout_s=30)
        wait_for_version(relay_url, 1, timeout_s=30)
        yield ShardcastStack(
            Target("origin", origin_url, origin, ShardcastPlanner(trainer, published, True)),
            Target("relay", relay_url, relay, ShardcastPlanner(trainer, published, False)),
            trainer,
        )
    finally:
        for p in started:
            p.stop()


# ---------------------------------------------------------------- signing and plans


@dataclass
class SigningAuth(AuthBase):
    """Signs the request exactly as sent (requests' prepared bytes), like `WorkerAuth` does.

    Signing the prepared request rather than the generated case means the signature covers the
    bytes schemathesis actually serialized. The knobs produce the wrongly signed variants.
    """

    signer: LocalAccount
    claim: str | None = None  # the address header; the signer's own when None
    timestamp: str | None = None  # signed verbatim; now when None
    tamper: bool = False  # sign other bytes than the body sent
    body: bytes | None = None  # the bytes a streamed (chunked) body will send

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        parts = urlsplit(r.url or "")
        body = self.body if self.body is not None else r.body or b""
        if isinstance(body, str):
            body = body.encode()
        if self.tamper:
            body = body + b"\x00"
        ts = self.timestamp if self.timestamp is not None else f"{time.time():.3f}"
        nonce = secrets.token_hex(16)
        # The server signs over Starlette's decoded path and the raw query string.
        text = canonical_request(r.method or "", unquote(parts.path), parts.query, body, ts, nonce)
        sig = self.signer.sign_message(encode_defunct(text=text)).signature
        r.headers[HEADER_ADDRESS] = self.claim or self.signer.address
        r.headers[HEADER_TIMESTAMP] = ts
        r.headers[HEADER_NONCE] = nonce
        r.headers[HEADER_SIGNATURE] = "0x" + sig.hex().removeprefix("0x")
        return r


# Printable ASCII without surrounding spaces: anything else requests refuses to send at all.
HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80).map(
    str.strip
)


@dataclass(frozen=True)
class Plan:
    """What a case does beyond its generated parts.

    `mode` and `pick` come from a `random.Random` seeded with the run's seed, not from
    hypothesis: hypothesis favours small integers and the first option of `sampled_from` (its
    shrink targets), which would put most cases in one mode. The payloads (`texts`, `blob`) are
    drawn by hypothesis with the case.
    """

    mode: str
    pick: int
    texts: tuple[str, ...]
    blob: bytes

    def choice(self, salt: str, n: int) -> int:
        """An evenly spread choice among `n`, independent for each purpose (`salt`)."""
        digest = hashlib.blake2b(f"{salt}:{self.pick}".encode(), digest_size=4).digest()
        return int.from_bytes(digest) % n


Payload = tuple[tuple[str, ...], bytes]
PAYLOADS: st.SearchStrategy[Payload] = st.tuples(
    st.tuples(HEADER_TEXT, HEADER_TEXT, HEADER_TEXT, HEADER_TEXT), st.binary(max_size=700)
)


class Planner:
    """Turns (case, plan) into the request: edits the case, returns extra `case.call` kwargs."""

    modes: tuple[str, ...] = ("generated",)
    wrong_modes: frozenset[str] = frozenset()  # modes whose 2xx is an auth bypass

    def label(self, case: schemathesis.Case, plan: Plan) -> str:
        """How the report names what this plan did to this case."""
        return plan.mode

    def requires_signature(self, path: str) -> bool:
        """Whether a 2xx for a wrongly signed case on `path` is an auth bypass."""
        return False

    def prepare(self, case: schemathesis.Case, plan: Plan) -> dict[str, Any]:
        return {}

    def observe(self, case: schemathesis.Case, plan: Plan, response: Any) -> None:
        """Learn from a response (a lease issued, an upload accepted)."""

    def order(self, method: str, path: str) -> int:
        return 0


# Stale, future and non-finite timestamps, validly signed: each must be refused with 401.
BAD_TIMESTAMPS = (
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e309",
    "-1e309",
    "0",
    "-1",
    "1e18",
    "",
    " ",
    "0x10",
    "1_000",
    "{past}",
    "{future}",
)


def hostile_body(
    kind: str, valid: bytes, max_bytes: int
) -> tuple[bytes, dict[str, str | None], bool]:
    """(body, headers, chunked) for bodies a JSON parser or a body cap should refuse cleanly.

    schemathesis generates from the schema, so it never sends these: nesting far past any
    schema, a body past the cap (with and without Content-Length), bytes that are not UTF-8,
    JSON that only Python's parser accepts, and JSON under other content types.
    """
    json_type: dict[str, str | None] = {"Content-Type": "application/json"}
    if kind == "deep_array":
        return b"[" * 200_000 + b"]" * 200_000, json_type, False
    if kind == "deep_object":
        return b'{"a":' * 50_000 + b"1" + b"}" * 50_000, json_type, False
    if kind == "unbalanced":
        return b"[" * 100_000, json_type, False
    if kind in ("over_cap", "over_cap_chunked"):
        pad = b" " * (max_bytes + 1024 - len(valid))
        return valid[:-1] + pad + valid[-1:], json_type, kind.endswith("chunked")
    if kind == "small_chunked":
        return valid, json_type, True
    if kind == "bad_utf8":
        return valid.replace(b'"', b'"\xff\xfe', 1), json_type, False
    if kind == "non_finite":
        return (
            b'{"worker": NaN, "pool_id": Infinity, "policy_version": -Infinity}',
            json_type,
            False,
        )
    if kind == "huge_int":
        return b'{"pool_id": 1' + b"0" * 5000 + b"}", json_type, False
    if kind == "duplicate_keys":
        return valid[:-1] + b', "pool_id": 1, "pool_id": "x"}', json_type, False
    if kind == "bom":
        return b"\xef\xbb\xbf" + valid, json_type, False
    if kind == "empty":
        return b"", json_type, False
    media = {
        "text_plain": "text/plain",
        "form": "application/x-www-form-urlencoded",
        "multipart": "multipart/form-data; boundary=x",
        "json_latin1": "application/json; charset=latin-1",
        "vendor_json": "application/vnd.swarm+json",
        "no_type": None,  # requests drops a None header: no Content-Type at all
    }[kind]
    return valid, {"Content-Type": media}, False


HOSTILE_KINDS = (
    "deep_array",
    "deep_object",
    "unbalanced",
    "over_cap",
    "over_cap_chunked",
    "small_chunked",
    "bad_utf8",
    "non_finite",
    "huge_int",
    "duplicate_keys",
    "bom",
    "empty",
    "text_plain",
    "form",
    "multipart",
    "json_latin1",
    "vendor_json",
    "no_type",
)


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


class OrchestratorPlanner(Planner):
    # Half the cases: the staked, registered member signing for itself, so they reach the routes.
    modes = (
        *("member",) * 7,
        "member_as_is",  # member signs the generated body unchanged
        "outsider",  # a key with no stake signs for itself
        "unsigned",
        "foreign_key",  # claims the member's address, signed by another key
        "tampered",  # the member's signature over other bytes
        "bad_timestamp",  # the member's valid signature over a bad timestamp
        "garbage",  # arbitrary text in the four signature headers
        "hostile",  # the member signs a body no schema describes (see `hostile_body`)
    )
    wrong_modes = frozenset({"unsigned", "foreign_key", "tampered", "bad_timestamp", "garbage"})

    def requires_signature(self, path: str) -> bool:
        # /healthz, /metrics, the read-only status API (/v1/status...) and the pool's
        # requirements (read before a worker has staked or registered) are open by design.
        return path.startswith("/v1/") and not path.startswith(("/v1/status", "/v1/requirements"))

    def label(self, case: schemathesis.Case, plan: Plan) -> str:
        if plan.mode == "hostile":
            return "hostile:" + HOSTILE_KINDS[plan.choice("hostile", len(HOSTILE_KINDS))]
        return plan.mode

    def __init__(self, member: LocalAccount, outsider: LocalAccount, pool_id: int) -> None:
        self.member, self.outsider, self.pool_id = member, outsider, pool_id
        self.stranger = Account.create()
        self.leases: list[dict[str, Any]] = []  # leases issued to the member, newest last

    def prime(self, url: str) -> None:
        """Register the member and take a lease, through the real signed client path."""
        from prime_swarm.protocol.signing import WorkerAuth

        with httpx.Client(base_url=url, auth=WorkerAuth(self.member), timeout=30) as http:
            who = {"worker": self.member.address, "pool_id": self.pool_id}
            http.post("/v1/register", json=who).raise_for_status()
            lease = http.post("/v1/lease", json={**who, "policy_version": POLICY_VERSION})
            lease.raise_for_status()
            self.leases.extend(lease.json()["leases"])

    def prepare(self, case: schemathesis.Case, plan: Plan) -> dict[str, Any]:
        signer = self.outsider if plan.mode == "outsider" else self.member
        if plan.mode in ("member", "outsider", "bad_timestamp") and isinstance(case.body, dict):
            case.body["worker"] = signer.address
            # Most cases name the right pool; some keep the generated one (404 wrong_pool).
            if plan.choice("pool", 8):
                case.body["pool_id"] = self.pool_id
            if "policy_version" in case.body and plan.choice("version", 3) == 0:
                case.body["policy_version"] = POLICY_VERSION - plan.choice("older", 2)
            if "lease_id" in case.body:
                self._answer_lease(case.body, plan)
        if plan.mode == "unsigned":
            return {}
        if plan.mode == "hostile":
            kind = HOSTILE_KINDS[plan.choice("hostile", len(HOSTILE_KINDS))]
            valid = json.dumps(case.body).encode() if isinstance(case.body, dict) else b"{}"
            data, headers, chunked = hostile_body(kind, valid, MAX_BODY_BYTES)
            # A generator makes requests send `Transfer-Encoding: chunked`, no Content-Length.
            body: bytes | Iterator[bytes] = _chunks(data) if chunked else data
            return {
                "data": body,
                "headers": headers,
                "auth": SigningAuth(self.member, body=data),
            }
        if plan.mode == "garbage":
            names = (HEADER_ADDRESS, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
            return {"headers": dict(zip(names, plan.texts, strict=True))}
        if plan.mode == "foreign_key":
            return {"auth": SigningAuth(self.stranger, claim=self.member.address)}
        if plan.mode == "tampered":
            return {"auth": SigningAuth(self.member, tamper=True)}
        if plan.mode == "bad_timestamp":
            ts = BAD_TIMESTAMPS[plan.choice("ts", len(BAD_TIMESTAMPS))]
            now = time.time()
            ts = ts.format(past=f"{now - 3600:.3f}", future=f"{now + 3600:.3f}")
            return {"auth": SigningAuth(self.member, timestamp=ts)}
        return {"auth": SigningAuth(signer)}

    def _answer_lease(self, body: dict[str, Any], plan: Plan) -> None:
        """Shape a generated submission to answer one of the member's leases, so it gets past
        the schema (proofs are base64) and the lease match to admission and the stream."""
        completions = body.get("completions")
        if isinstance(completions, list):
            for c in completions:
                if isinstance(c, dict) and plan.choice("proof", 4):
                    c["proof"] = base64.b64encode(plan.blob[:96]).decode()
        if not self.leases or not plan.choice("lease", 4):
            return
        lease = self.leases[plan.choice("which", len(self.leases))]
        body["lease_id"] = lease["lease_id"]
        if plan.choice("match", 3):
            body.update(task_id=lease["task_id"], pool_id=self.pool_id)
            body["policy_version"] = POLICY_VERSION - plan.choice("older", 2)
            if isinstance(completions, list) and completions:
                size, cap = lease["group_size"], lease["sampling"]["max_new_tokens"]
                body["completions"] = (completions * size)[:size]
                for c in completions:
                    if isinstance(c, dict) and isinstance(c.get("token_ids"), list):
                        c["token_ids"] = c["token_ids"][:cap] or [1]

    def observe(self, case: schemathesis.Case, plan: Plan, response: Any) -> None:
        if response.status_code != 200 or not case.operation.path.endswith("/lease"):
            return
        try:
            issued = json.loads(response.content).get("leases")
        except ValueError:
            return
        for lease in issued if isinstance(issued, list) else []:
            if isinstance(lease, dict) and isinstance(lease.get("lease_id"), str):
                self.leases = [*self.leases[-15:], lease]


# Range values that stress the parser: valid, open, suffix, inverted, multi, out of bounds.
RANGES = (
    "bytes=0-99",
    "bytes=100-",
    "bytes=-100",
    "bytes=0-0",
    "bytes=99-10",
    "bytes=0-99999999999999999999",
    "bytes=99999999999-",
    "bytes=-0",
    "bytes=0-1,5-9,3-4",
    "bytes=0-10,0-10",
    "bytes=--1",
    "bytes=",
    "bytes=a-b",
    "items=0-10",
    "bytes=0-1,",
    "bytes= 0 - 1",
)


def manifest_for(version: int, blobs: dict[str, bytes], shard_size: int, trainer: str) -> Manifest:
    files = []
    for name, data in sorted(blobs.items()):
        shards = [
            ShardInfo(
                index=i,
                offset=off,
                size=len(data[off : off + shard_size]),
                sha256=hashlib.sha256(data[off : off + shard_size]).hexdigest(),
            )
            for i, off in enumerate(range(0, len(data), shard_size))
        ]
        files.append(
            FileEntry(
                name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest(), shards=shards
            )
        )
    return Manifest(
        version=version,
        shard_size=shard_size,
        files=files,
        model_hash=model_hash(files),
        trainer=trainer,
    )


class ShardcastPlanner(Planner):
    """Origin (uploads and reads) or relay (reads): trainer-signed uploads, real shard paths."""

    # Uploads (PUT) follow the mode; reads use a held shard unless the mode is "generated".
    modes = (
        *("trainer",) * 3,  # a manifest signed by the trainer / the exact shard bytes
        "forger",  # a manifest naming the trainer, signed by another key / wrong shard bytes
        "inconsistent",  # trainer-signed but the shard table lies / one byte too many
        "random",  # random bytes as the body
        "generated",  # the request exactly as schemathesis generated it
    )

    def __init__(
        self, trainer: LocalAccount, published: dict[int, dict[str, bytes]], uploads: bool
    ) -> None:
        self.trainer, self.uploads = trainer, uploads
        self.forger = Account.create()
        # version -> {file name: bytes} for versions the origin holds (published or fuzzed).
        self.known: dict[int, dict[str, bytes]] = {v: dict(f) for v, f in published.items()}
        self.shard_size: dict[int, int] = dict.fromkeys(published, SHARD_SIZE)
        self.pending: dict[int, tuple[dict[str, bytes], int]] = {}

    def label(self, case: schemathesis.Case, plan: Plan) -> str:
        if case.operation.method.upper() == "PUT" or plan.mode == "generated":
            return plan.mode
        return "held"

    def order(self, method: str, path: str) -> int:
        # Reads first, uploads last: fuzzed versions that complete evict the published one.
        return 1 if method == "PUT" else 0

    def _known_shard(self, plan: Plan) -> tuple[int, str, int, bytes] | None:
        shards = [
            (v, name, i, data[off : off + self.shard_size[v]])
            for v, files in self.known.items()
            for name, data in sorted(files.items())
            for i, off in enumerate(range(0, len(data), self.shard_size[v]))
        ]
        return shards[plan.choice("shard", len(shards))] if shards else None

    def prepare(self, case: schemathesis.Case, plan: Plan) -> dict[str, Any]:
        method, path = case.operation.method.upper(), case.operation.path
        params = case.path_parameters if isinstance(case.path_parameters, dict) else {}
        if isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
            case.query["wait"] = min(case.query["wait"], MAX_WAIT_S)
        if method == "PUT" and path.endswith("/manifest"):
            return self._put_manifest(params, plan)
        if method == "PUT":
            return self._put_shard(params, plan)
        if plan.mode == "generated":
            return {}
        shard = self._known_shard(plan)
        if shard is not None and path.endswith("/manifest"):
            params["version"] = shard[0]
        elif shard is not None and "{index}" in path:
            version, name, index, data = shard
            params.update(version=version, name=name, index=index)
            headers: dict[str, str] = {}
            ranged = plan.choice("range", 3)
            if ranged == 0:
                headers["Range"] = RANGES[plan.choice("which", len(RANGES))]
            elif ranged == 1:
                headers["Range"] = plan.texts[0]
            etag = plan.choice("etag", 5)
            if etag == 0:
                headers["If-None-Match"] = f'"{hashlib.sha256(data).hexdigest()}"'
            elif etag == 1:
                headers["If-None-Match"] = plan.texts[1]
            return {"headers": headers}
        return {}

    def _put_manifest(self, params: dict[str, Any], plan: Plan) -> dict[str, Any]:
        version = params.get("version")
        if plan.mode == "generated":
            return {}
        if plan.mode == "random" or not isinstance(version, int) or version < 0:
            return {"data": plan.blob}
        size = (64, 128, 1000)[plan.choice("size", 3)]
        blobs = {"weights.bin": plan.blob}
        if plan.choice("config", 2):
            blobs["config.json"] = plan.texts[0].encode()
        m = manifest_for(version, blobs, size, self.trainer.address)
        if plan.mode == "forger":
            forged = sign_manifest(
                m.model_copy(update={"trainer": self.forger.address}), self.forger
            )
            body = SignedManifest(manifest=m, signature=forged.signature)
        elif plan.mode == "inconsistent":
            bad_files = [f.model_copy(update={"size": f.size + 1}) for f in m.files]
            body = sign_manifest(m.model_copy(update={"files": bad_files}), self.trainer)
        else:
            body = sign_manifest(m, self.trainer)
            self.pending[version] = (blobs, size)
        return {"data": body.model_dump_json().encode(), "headers": _json_type()}

    def _put_shard(self, params: dict[str, Any], plan: Plan) -> dict[str, Any]:
        if plan.mode == "generated":
            return {}
        if plan.mode == "random":
            return {"data": plan.blob}
        shard = self._known_shard(plan)
        if shard is None:
            return {"data": plan.blob}
        version, name, index, data = shard
        params.update(version=version, name=name, index=index)
        if plan.mode == "forger" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        elif plan.mode == "inconsistent":
            data = data + b"\0"
        return {"data": data}

    def observe(self, case: schemathesis.Case, plan: Plan, response: Any) -> None:
        path = case.operation.path
        version = case.path_parameters.get("version") if case.path_parameters else None
        if case.operation.method.upper() != "PUT" or not path.endswith("/manifest"):
            return
        pending = self.pending.pop(version, None) if isinstance(version, int) else None
        if pending is not None and response.status_code == 200:
            self.known[version], self.shard_size[version] = pending
            # Keep the shard list short: the newest few versions are what the origin still holds.
            for old in sorted(self.known)[:-6]:
                del self.known[old], self.shard_size[old]


def _json_type() -> dict[str, str]:
    return {"Content-Type": "application/json"}


# ---------------------------------------------------------------- the run


@dataclass
class ServiceReport:
    cases: int = 0
    server_errors: int = 0
    crashes: int = 0
    seconds: float = 0.0
    auth_bypass: int = 0
    transport_errors: int = 0
    schema: str = "GET /openapi.json"
    alive_after: bool = True
    healthz_after: int | None = None
    operations: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    modes: Counter[str] = field(default_factory=Counter)
    probes: dict[str, int | None] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    skipped_operations: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "server_errors": self.server_errors,
            "crashes": self.crashes,
            "seconds": round(self.seconds, 2),
            "auth_bypass": self.auth_bypass,
            "transport_errors": self.transport_errors,
            "alive_after": self.alive_after,
            "healthz_after": self.healthz_after,
            "schema": self.schema,
            "operations": dict(sorted(self.operations.items())),
            "statuses": dict(sorted(self.statuses.items())),
            "reasons": dict(self.reasons.most_common(40)),
            "plans": dict(sorted(self.modes.items())),
            "probes": self.probes,
            "skipped_operations": self.skipped_operations,
            "failures": self.failures,
        }


class ServiceDied(Exception):
    pass


def _trunc(value: object, limit: int = TRUNCATE) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _log_size(proc: ManagedProcess) -> int:
    try:
        return proc.log_path.stat().st_size
    except OSError:
        return 0


def _log_excerpt(proc: ManagedProcess, start: int, end: int | None, limit: int = 3000) -> str:
    """The service's log between two offsets; a long one keeps its end, where the exception is."""
    try:
        with open(proc.log_path, "rb") as f:
            f.seek(start)
            raw = f.read((end - start) if end is not None else -1)
    except OSError:
        return ""
    text = raw.decode(errors="replace").strip()
    return text if len(text) <= limit else text[:300] + "\n...\n" + text[-(limit - 300) :]


def load_schema(target: Target, report: ServiceReport) -> schemathesis.BaseSchema:
    """The schema the process serves; failing to serve it is a server error, and the end."""
    log_start = _log_size(target.process)
    status = _probe(target.url + "/openapi.json")
    report.probes["GET /openapi.json"] = status
    if status == 200:
        return schemathesis.openapi.from_url(target.url + "/openapi.json")
    if status is not None and status >= 500:
        time.sleep(0.3)  # the traceback is logged after the response is sent
        report.server_errors += 1
        report.failures.append(
            {
                "check": "not_a_server_error",
                "method": "GET",
                "path": "/openapi.json",
                "status": status,
                "reproduce": f"curl {target.url}/openapi.json",
                "log": _log_excerpt(target.process, log_start, None),
            }
        )
    raise RuntimeError(f"{target.name} does not serve its schema ({status})")


def _probe(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=REQUEST_TIMEOUT_S).status_code
    except httpx.HTTPError:
        return None


def _case_strategy(op: schemathesis.APIOperation) -> st.SearchStrategy[schemathesis.Case]:
    """Valid and invalid cases alike (schemathesis' positive and negative generation)."""
    strategies = [op.as_strategy(GenerationMode.POSITIVE)]
    try:
        strategies.append(op.as_strategy(GenerationMode.NEGATIVE))
    except Exception:  # nothing to negate (no parameters, no body)
        pass
    return st.one_of(strategies)


def _budgets(ops: list[schemathesis.APIOperation], cases: int) -> list[int]:
    """Operations with inputs share the cases; those without any (/healthz, /v1/versions) get
    a handful, which differ only in their plan."""

    def has_inputs(op: schemathesis.APIOperation) -> bool:
        return bool(list(op.iter_parameters())) or bool(op.body)

    rich = [op for op in ops if has_inputs(op)]
    share = math.ceil(cases / max(1, len(rich)))
    return [share if has_inputs(op) else 5 for op in ops]


def fuzz_service(
    target: Target, cases: int, seed: int, *, progress: Callable[[str], None] | None = None
) -> ServiceReport:
    """Run at least `cases` generated cases against `target`; count 5xx, crashes, bypasses."""
    report = ServiceReport()
    started = time.monotonic()
    schema = load_schema(target, report)
    ops: list[schemathesis.APIOperation] = []
    for result in schema.get_all_operations():
        try:
            ops.append(result.ok())
        except AttributeError:
            report.skipped_operations[str(result.err())[:80]] = "invalid in schema"
    ops.sort(key=lambda op: (target.planner.order(op.method.upper(), op.path), op.label))
    session = requests.Session()
    rng = random.Random(seed)
    pending: list[dict[str, Any]] = []  # failures whose log excerpt ends at the next case

    def run_case(case: schemathesis.Case, payload: Payload) -> None:
        plan = Plan(rng.choice(target.planner.modes), rng.getrandbits(32), payload[0], payload[1])
        if not target.process.alive():
            raise ServiceDied
        log_start = _log_size(target.process)
        for f in pending:
            f["log"] = _log_excerpt(target.process, f.pop("_log_start"), log_start)
        pending.clear()
        kwargs = target.planner.prepare(case, plan)
        label = f"{case.operation.method.upper()} {case.operation.path}"
        report.cases += 1
        report.operations[label] += 1
        report.modes[target.planner.label(case, plan)] += 1
        try:
            response = case.call(
                base_url=target.url, session=session, timeout=REQUEST_TIMEOUT_S, **kwargs
            )
        except requests.RequestException as exc:
            time.sleep(0.2)
            if not target.process.alive():
                report.crashes += 1
                _record(report, case, plan, None, f"process exited: {exc!r}", log_start, pending)
                raise ServiceDied from exc
            report.transport_errors += 1
            _record(report, case, plan, None, f"transport error: {exc!r}", log_start, pending)
            return
        report.statuses[str(response.status_code)] += 1
        report.reasons[f"{label} {response.status_code} {_reason(response)}".strip()] += 1
        if (
            plan.mode in target.planner.wrong_modes
            and target.planner.requires_signature(case.operation.path)
            and 200 <= response.status_code < 300
        ):
            report.auth_bypass += 1
            _record(report, case, plan, response, "auth_bypass", log_start, pending)
        try:
            case.validate_response(response, checks=[not_a_server_error])
        except (Failure, BaseExceptionGroup):
            report.server_errors += 1
            _record(report, case, plan, response, "not_a_server_error", log_start, pending)
        target.planner.observe(case, plan, response)

    def run_operation(op: schemathesis.APIOperation, n: int, op_seed: int) -> None:
        @hypothesis.settings(
            max_examples=n,
            database=None,
            deadline=None,
            derandomize=False,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.seed(op_seed)
        @given(case=_case_strategy(op), payload=PAYLOADS)
        def one(case: schemathesis.Case, payload: Payload) -> None:
            run_case(case, payload)

        try:
            one()
        except Unsatisfiable as exc:
            report.skipped_operations[op.label] = f"unsatisfiable: {exc}"[:200]

    try:
        budgets = _budgets(ops, cases)
        for round_ in range(4):
            for i, (op, n) in enumerate(zip(ops, budgets, strict=True)):
                if n:
                    run_operation(op, n, seed * 1_000_003 + round_ * 1000 + i)
            if progress:
                progress(f"{target.name}: {report.cases} cases after round {round_ + 1}")
            if report.cases >= cases:
                break
            # An operation whose input space runs dry gives fewer cases than asked (hypothesis
            # does not repeat itself): another round, with new seeds, makes up the difference.
            budgets = _budgets(ops, cases - report.cases)
    except ServiceDied:
        pass
    time.sleep(0.3)  # let the last traceback reach the log
    for f in pending:
        f["log"] = _log_excerpt(target.process, f.pop("_log_start"), None)
    # Routes a process serves outside its schema: the docs pages and the observability pair.
    for path in ("/docs", "/redoc", "/metrics"):
        status = _probe(target.url + path) if target.process.alive() else None
        report.probes[f"GET {path}"] = status
        if status is not None and status >= 500:
            report.server_errors += 1
            report.failures.append({"method": "GET", "path": path, "status": status})
    report.alive_after = target.process.alive()
    report.healthz_after = target.healthz() if report.alive_after else None
    if not report.alive_after or report.healthz_after != 200:
        report.crashes = max(report.crashes, 1)
        if not report.alive_after:
            report.failures.append(
                {"crash": f"exit code {target.process.proc.returncode}", "log": _tail(target)}
            )
    report.seconds = time.monotonic() - started
    return report


def _reason(response: Any) -> str:
    """The refusal's `detail.reason` (or a short `detail`), to show how far cases got."""
    if response.status_code < 400:
        return ""
    try:
        detail = json.loads(response.content).get("detail")
    except (ValueError, AttributeError):
        return ""
    if isinstance(detail, dict):
        return str(detail.get("reason", ""))[:40]
    if isinstance(detail, str):
        return detail.split(":")[0][:40]
    return ""


def _tail(target: Target) -> str:
    return _trunc(target.process.tail(40), 3000)


def _record(
    report: ServiceReport,
    case: schemathesis.Case,
    plan: Plan,
    response: Any,
    check: str,
    log_start: int,
    pending: list[dict[str, Any]],
) -> None:
    if len(report.failures) >= MAX_FAILURE_EXAMPLES:
        return
    try:
        curl = case.as_curl_command()
    except Exception:  # the curl rendering is a courtesy; never let it hide the failure
        curl = ""
    entry: dict[str, Any] = {
        "check": check,
        "method": case.operation.method.upper(),
        "path": case.formatted_path,
        "status": response.status_code if response is not None else None,
        "plan": plan.mode,
        "query": _trunc(case.query),
        "body": _trunc(case.body),
        "response": _trunc(response.content, 300) if response is not None else None,
        "reproduce": _trunc(curl, 800),
        "_log_start": log_start,
    }
    report.failures.append(entry)
    pending.append(entry)
