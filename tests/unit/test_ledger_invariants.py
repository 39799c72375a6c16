"""The ledger against its rules (tests/support/ledger_machine.py): random transactions by every
kind of actor, each outcome compared with the model and the invariants checked after every step.
A short run of the real contract and one planted bug by default; every planted bug and a long run
in the slow suite (`make bench-ledger` records the long run's figures)."""

from __future__ import annotations

import pytest

pytest.importorskip("boa", reason="titanoboa (the dev extra) is not installed")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
from ledger_machine import PLANTED_BUGS, LedgerMachine, machine_for, planted  # noqa: E402

SHORT = settings(
    max_examples=25,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
# Finding is enough: shrinking a planted bug's counterexample would only cost time.
FIND = settings(SHORT, max_examples=300, phases=[Phase.generate])


def test_the_ledger_keeps_its_rules_over_random_transactions() -> None:
    before = LedgerMachine.transactions
    run_state_machine_as_test(LedgerMachine, settings=SHORT)
    assert LedgerMachine.transactions - before >= 500


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "bug", [b if b == "claim_keeps_balance" else pytest.param(b, marks=pytest.mark.slow)
            for b in sorted(PLANTED_BUGS)],
)  # fmt: skip
def test_a_planted_bug_is_caught(bug: str) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine_for(planted(bug)), settings=FIND)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_twenty_thousand_transactions_keep_the_rules() -> None:
    before = LedgerMachine.transactions
    run_state_machine_as_test(
        LedgerMachine, settings=settings(SHORT, max_examples=450, stateful_step_count=50)
    )
    assert LedgerMachine.transactions - before >= 20_000
