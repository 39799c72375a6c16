#!/usr/bin/env python3
"""Container healthcheck with the standard library only (the slim images have no curl).

prime-healthcheck http://127.0.0.1:8000/healthz       # 200 from a service's /healthz
prime-healthcheck --rpc http://127.0.0.1:8545         # an EVM JSON-RPC answers eth_chainId
prime-healthcheck                                     # this image's own service (HEALTHCHECK)
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def own_service() -> list[str]:
    """The arguments that check this image's service (SWARM_EXTRA) on the port its settings
    read; none where it serves nothing to ask (metrics off): running is healthy then."""
    env = os.environ.get
    extra = env("SWARM_EXTRA", "")
    if extra == "chain":
        return ["--rpc", "http://127.0.0.1:8545"]
    port = {
        "relay": env("PRIME_RELAY_PORT", "8700"),
        "orchestrator": env("PRIME_ORCH_PORT", "8000"),
        "validator": env("PRIME_VALIDATOR_METRICS_PORT", "0"),
        "trainer": env("PRIME_TRAINER_METRICS_PORT", "0"),
        "worker": env("PRIME_WORKER_METRICS_PORT", "0"),
    }.get(extra, "0")
    return [] if port == "0" else [f"http://127.0.0.1:{port}/healthz"]


def main(argv: list[str]) -> int:
    if not argv:
        argv = own_service()
        if not argv:
            return 0
    rpc = "--rpc" in argv
    urls = [a for a in argv if a != "--rpc"]
    if len(urls) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data, headers = None, {}
    if rpc:
        data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
        data, headers = data.encode(), {"Content-Type": "application/json"}
    try:
        request = urllib.request.Request(urls[0], data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=3) as response:
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            if rpc and "result" not in json.loads(body):
                raise RuntimeError(f"no result: {body[:200]!r}")
    except Exception as exc:  # any failure is "unhealthy"; say why for `docker inspect`
        print(f"unhealthy: {urls[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
