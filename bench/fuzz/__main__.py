"""`make fuzz`: schemathesis against orchestrator, origin and relay, each a real process on
127.0.0.1, 1000 generated cases each, signed as a worker or trainer would sign them (the harness
and what each case draws: tests/support/fuzz_harness.py).

    python -m bench.fuzz [--cases 1000] [--seed 0] [--services orchestrator,origin,relay]

Writes bench/results/fuzz.json: {service: {"cases", "server_errors", "crashes", ...}, "meta"};
exits 1 on any 5xx, crash or auth bypass.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import hypothesis
import schemathesis

from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.localnet.redis_server import RedisServer
from tests.support.fuzz_harness import Target, fuzz_service, orchestrator_stack, shardcast_stack

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fuzz.json"
SERVICES = ("orchestrator", "origin", "relay")


def run(cases: int, seed: int, services: tuple[str, ...], out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    started = time.monotonic()
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="prime-fuzz-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        targets: list[Target] = []
        if "orchestrator" in services:
            node = stack.enter_context(Anvil(accounts=2))
            redis = RedisServer(work / "redis", work / "logs")
            stack.callback(redis.stop)
            owner = node.dev_accounts(1)[0]
            orch = stack.enter_context(
                orchestrator_stack(node.rpc_url, owner, redis.url, work / "logs")
            )
            targets.append(orch.target)
        if "origin" in services or "relay" in services:
            sc = stack.enter_context(shardcast_stack(work / "shardcast"))
            # The relay first: fuzzed uploads to the origin may evict the published version.
            targets += [t for t in (sc.relay, sc.origin) if t.name in services]
        for target in targets:
            say(f"fuzzing {target.name} at {target.url} ({cases} cases, seed {seed})")
            report = fuzz_service(target, cases, seed, progress=say)
            results[target.name] = report.as_json()
            say(
                f"{target.name}: {report.cases} cases, {report.server_errors} server errors, "
                f"{report.crashes} crashes, {report.auth_bypass} auth bypasses "
                f"in {report.seconds:.1f}s"
            )
    ordered = {name: results[name] for name in SERVICES if name in results}
    ordered["meta"] = {
        "schemathesis": schemathesis.__version__,
        "hypothesis": hypothesis.__version__,
        "cases_per_service": cases,
        "seed": seed,
        "checks": [
            "not_a_server_error (schemathesis), on every case and on /openapi.json, /docs, "
            "/redoc, /metrics",
            "process alive and /healthz 200 after the run (else a crash)",
            "no 2xx for a wrongly signed request to a signed route (auth_bypass)",
        ],
        "seconds": round(time.monotonic() - started, 1),
        "command": " ".join(["python -m bench.fuzz", *sys.argv[1:]]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(ordered, indent=2) + "\n")
    say(f"wrote {out}")
    return ordered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="generated cases per service")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument("--services", default=",".join(SERVICES), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    services = tuple(s for s in args.services.split(",") if s)
    unknown = set(services) - set(SERVICES)
    if unknown:
        parser.error(f"unknown services {sorted(unknown)}; choose from {SERVICES}")
    results = run(args.cases, args.seed, services, args.out)
    bad = [
        n
        for n in services
        if results[n]["server_errors"] or results[n]["crashes"] or results[n]["auth_bypass"]
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
