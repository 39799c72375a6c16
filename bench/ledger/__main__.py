"""`make bench-ledger`: the ledger's rule-based state machine (tests/support/ledger_machine.py)
run long on the real contract, and once on each planted-bug copy, which it must catch.

    python -m bench.ledger [--transactions 20000]

Records `ledger_invariants` in bench/results/ha.json: transactions sent (reverted ones
included; hypothesis draws the sequences at random, so each run tries new ones), violations
(0, or 1 with the first failure: hypothesis stops at it), and for each planted bug whether it
was caught and after how many transactions.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.support.ledger_machine import PLANTED_BUGS, LedgerMachine, machine_for, planted

RESULTS = Path(__file__).resolve().parents[1] / "results" / "ha.json"
STEPS = 50  # transactions per run after the set-up's twelve
# No shrinking: the bench records that a failure happened and the first one found.
SETTINGS = settings(
    stateful_step_count=STEPS,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def run(machine: type[LedgerMachine], examples: int) -> dict[str, object]:
    machine.transactions = machine.reverted = 0
    start = time.perf_counter()
    failure = None
    try:
        run_state_machine_as_test(machine, settings=settings(SETTINGS, max_examples=examples))
    except AssertionError as e:
        # A bare `assert` carries no message: the failure is then named by its type.
        lines = str(e).strip().splitlines()
        failure = (lines[0] if lines else type(e).__name__)[:300]
    return {
        "transactions": machine.transactions,
        "reverted": machine.reverted,
        "seconds": round(time.perf_counter() - start, 1),
        "failure": failure,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transactions", type=int, default=20_000, help="at least this many")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.transactions < 1:
        p.error("--transactions must be at least 1")

    # Each run sends its set-up (about a dozen) and up to STEPS rules, some of which send
    # nothing; runs are added until the count is reached.
    long = run(LedgerMachine, args.transactions // STEPS + 1)
    while long["failure"] is None and long["transactions"] < args.transactions:
        more = run(LedgerMachine, (args.transactions - long["transactions"]) // STEPS + 1)
        long = {k: more[k] if k == "failure" else long[k] + more[k] for k in long}
        long["seconds"] = round(long["seconds"], 1)
    print(f"[ledger] real contract: {json.dumps(long)}", flush=True)

    planted_runs = {}
    for bug in sorted(PLANTED_BUGS):
        r = run(machine_for(planted(bug)), 400)
        planted_runs[bug] = {"caught": r["failure"] is not None, **r}
        print(f"[ledger] planted {bug}: {json.dumps(planted_runs[bug])}", flush=True)

    result = {
        "transactions": long["transactions"],
        "reverted": long["reverted"],
        "seconds": long["seconds"],
        "violations": 0 if long["failure"] is None else 1,
        "failure": long["failure"],
        "planted_bug_caught": all(r["caught"] for r in planted_runs.values()),
        "planted_bugs": planted_runs,
        "config": {
            "steps_per_run": STEPS,
            "machine": f"{platform.machine()}, titanoboa (in process)",
            "command": "python -m bench.ledger",
        },
    }
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["ledger_invariants"] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
