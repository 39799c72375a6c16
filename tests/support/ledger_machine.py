"""SwarmLedger against its rules: a plain Python model of what every public function must do, and a
hypothesis rule-based state machine that sends random transactions by every kind of actor (owner,
trainer, validators, workers, a stranger) to the deployed contract (titanoboa, in process).

Each transaction's outcome is compared with the model's: reverted or not, and why (the revert
reason); return values; and after every step the ledger's invariants:

- the ether the contract holds equals stakes + pool funds + burnt, and what was paid in minus
  what was paid out;
- rewards follow attested units: for every worker, what it claimed plus what it can claim plus
  what is pending equals its attested units times the rate, and rewards become claimable only
  after the challenge window (the model's epochs);
- a slash never exceeds the stake nor SLASH_BPS of it;
- a worker who left, was ejected or was slashed below the minimum is never credited;
- only the owner and the validators can call what they call.

The pool-wide figures are checked after every step, each account a step touched right after it,
and every account every tenth step. `PLANTED_BUGS` are copies of the contract with one bug each;
the machine must fail on them (tests/unit/test_ledger_invariants.py, bench/ledger).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import boa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from prime_swarm.libs.chain import merkle
from prime_swarm.libs.chain.artifacts import CONTRACTS_DIR
from prime_swarm.libs.chain.client import BPS, WORK_ID_LIMIT
from prime_swarm.libs.chain.models import Work

SOURCE = (CONTRACTS_DIR / "SwarmLedger.vy").read_text()
SLASH_BPS = 5_000
UNBONDING = 8
CHALLENGE = 2
MIN_STAKE = 100
RATE = 3
WORKERS = ("worker0", "worker1", "worker2", "worker3")
ACTORS = ("owner", "trainer", "validator0", "validator1", *WORKERS, "stranger")
# Weighted draws: most calls come from the role that may make them, some from anyone.
ANYONE = st.sampled_from(ACTORS)
A_VALIDATOR = st.sampled_from(("validator0", "validator1") * 4 + ACTORS)
AN_OWNER = st.sampled_from(("owner", "owner", "owner", *ACTORS))
A_WORKER = st.sampled_from(WORKERS * 3 + ("stranger", "validator0"))
VALUES = st.sampled_from((0, 1, 40, 60, 100, 250))
FRACTIONS = st.sampled_from((0, 1, 10, 50, 51, 100, 200))  # percent of the stake
# Mostly ids a worker is handed (a few dozen), one in seventeen at a bitmap word's edge or past
# what the ledger stores; mostly 1-7 units, one in fifty zero: a batch with one bad item reverts
# whole, so bad items are rare enough that most batches land.
ODD_IDS = (255, 256, WORK_ID_LIMIT - 1, WORK_ID_LIMIT, 2**128, 2**256 - 1)
WORK_IDS = st.integers(0, 101).map(lambda i: ODD_IDS[i - 96] if i >= 96 else i % 32)
UNITS = st.integers(0, 49).map(lambda u: u % 7 + 1 if u else 0)
ITEMS = st.lists(st.tuples(A_WORKER, WORK_IDS, UNITS), min_size=1, max_size=6)
WAITS = st.sampled_from((0, 1, CHALLENGE, 3 * CHALLENGE))

# One bug each, planted by replacing text of the real source (the text must be there).
PLANTED_BUGS: dict[str, tuple[str, str]] = {
    "claim_keeps_balance": (
        "self._claimable[pool_id][msg.sender] = claimable - amount",
        "self._claimable[pool_id][msg.sender] = claimable",
    ),
    "matured_bucket_paid_twice": ("            self._buckets[pool_id][worker][i] = 0\n", ""),
    "slash_above_cap": (
        '    assert amount * BPS <= stake * SLASH_BPS, "slash above SLASH_BPS of stake"\n',
        "",
    ),
    "former_member_credited": (
        "            if not self.is_member[pool_id][worker]:\n"
        "                run_skip = SKIP_NOT_MEMBER\n"
        "            elif",
        "            if",
    ),
    "withdraw_while_unbonding": (
        '    assert block.number >= self.unbonding_until[pool_id][msg.sender], "still unbonding"\n',
        "",
    ),
    "anyone_registers_validators": (
        "def register_validator(pool_id: uint256, validator: address):\n"
        "    self._check_owner(pool_id)\n",
        "def register_validator(pool_id: uint256, validator: address):\n",
    ),
}


def planted(bug: str) -> str:
    old, new = PLANTED_BUGS[bug]
    assert SOURCE.count(old) == 1, f"planted bug {bug!r} no longer matches the contract"
    return SOURCE.replace(old, new)


@functools.cache
def _deployer(source: str) -> Any:
    return boa.loads_partial(source, name="SwarmLedger")


class _NoStorage:
    def dump(self) -> dict[str, object]:
        return {}


@dataclass
class Account:
    stake: int = 0
    member: bool = False
    unbonding_until: int = 0
    units: int = 0
    id_floor: int = 0
    settled: set[int] = field(default_factory=set)
    claimable: int = 0
    pending: dict[int, int] = field(default_factory=dict)
    """Unmatured rewards by the epoch (block // CHALLENGE) they were credited in."""
    claimed: int = 0


@dataclass
class Batch:
    block: int
    items: list[Work]


@dataclass
class Ledger:
    """What the contract must hold: one pool, its accounts, and the ether that moved."""

    status: str = "pending"
    funds: int = 0
    burnt: int = 0
    reporter_bps: int = 1_000
    burn_slashed: bool = False
    validators: set[str] = field(default_factory=set)
    accounts: dict[str, Account] = field(default_factory=lambda: {a: Account() for a in ACTORS})
    batches: list[Batch] = field(default_factory=list)
    disputed: set[bytes] = field(default_factory=set)
    paid_in: int = 0
    paid_out: int = 0

    def matured(self, a: Account, block: int) -> int:
        return sum(v for e, v in a.pending.items() if block >= (e + 2) * CHALLENGE)

    def rewards_of(self, a: Account, block: int) -> tuple[int, int]:
        mature = self.matured(a, block)
        return a.claimable + mature, sum(a.pending.values()) - mature

    def take_stake(self, who: str, caller: str, amount: int) -> str | None:
        """The slash rule shared by `slash` and `dispute`: the reason it reverts, or None
        after taking `amount` (the reporter's share to `caller`)."""
        a = self.accounts[who]
        if amount > a.stake:
            return "slash exceeds stake"
        if amount * BPS > a.stake * SLASH_BPS:
            return "slash above SLASH_BPS of stake"
        share = amount * self.reporter_bps // BPS
        a.stake -= amount
        if self.burn_slashed:
            self.burnt += amount - share
        else:
            self.funds += amount - share
        self.paid_out += share
        return None


class LedgerMachine(RuleBasedStateMachine):
    """Set `source` on a subclass to drive another copy of the contract (`machine_for`)."""

    source = SOURCE
    transactions = 0
    """Transactions sent by every instance (reverted ones included): the bench's count."""
    reverted = 0

    def __init__(self) -> None:
        super().__init__()
        self._anchor = boa.env.anchor()
        self._anchor.__enter__()
        self.addr = {a: boa.env.generate_address(a) for a in ACTORS}
        self.name = {v: k for k, v in self.addr.items()}
        for a in self.addr.values():
            boa.env.set_balance(a, 10**21)
        self.c = _deployer(self.source).deploy(SLASH_BPS, UNBONDING, CHALLENGE)
        # titanoboa writes the whole storage into every revert's message, which grows with each
        # key the run touched (most of a long run's time); the machine reads only the reason.
        self.c._storage = _NoStorage()
        self.m = Ledger()
        self.touched: set[str] = set()
        self.steps = 0

    def teardown(self) -> None:
        self._anchor.__exit__(None, None, None)

    @property
    def block(self) -> int:
        return boa.env.evm.patch.block_number

    def send(self, expected: str | None, fn: str, *args: Any, sender: str, value: int = 0) -> Any:
        """Call `fn` as `sender`; it must revert with `expected`, or succeed when that is None."""
        type(self).transactions += 1
        self.touched.add(sender)
        try:
            out = getattr(self.c, fn)(*args, sender=self.addr[sender], value=value)
        except boa.BoaError as e:
            type(self).reverted += 1
            assert expected is not None, f"{fn}{args} by {sender} reverted: {str(e)[-400:]}"
            assert expected in str(e), f"{fn}{args} by {sender}: want {expected!r}, got {e}"
            return None
        assert expected is None, f"{fn}{args} by {sender} succeeded; the rules say {expected!r}"
        return out

    def _owner_only(self, caller: str) -> str | None:
        return None if caller == "owner" else "not the pool owner"

    # --- set-up: one pool, its slash policy chosen at random, active and funded ---

    @initialize(
        reporter_bps=st.sampled_from((0, 1_000, 10_000)),
        burn=st.booleans(),
        stakes=st.lists(st.sampled_from((MIN_STAKE, 250)), min_size=3, max_size=3),
    )
    def open_pool(self, reporter_bps: int, burn: bool, stakes: list[int]) -> None:
        self.pool = self.send(
            None, "create_pool", "http://orchestrator", MIN_STAKE, RATE, self.addr["trainer"],
            sender="owner",
        )  # fmt: skip
        self.send(None, "set_slash_policy", self.pool, reporter_bps, burn, sender="owner")
        self.m.reporter_bps, self.m.burn_slashed = reporter_bps, burn
        self.send(None, "activate_pool", self.pool, sender="owner")
        self.m.status = "active"
        for v in ("validator0", "validator1"):
            self.send(None, "register_validator", self.pool, self.addr[v], sender="owner")
            self.m.validators.add(v)
        self.send(None, "fund_pool", self.pool, sender="owner", value=200)
        self.m.funds += 200
        self.m.paid_in += 200
        # Three of the four workers start as members, so runs reach work and rewards early.
        for who, stake in zip(WORKERS, stakes, strict=False):
            self.join(who, stake)

    # --- rules: every public function that changes state ---

    @rule(who=ANYONE, value=VALUES)
    def join(self, who: str, value: int) -> None:
        a = self.m.accounts[who]
        want = None
        if self.m.status != "active":
            want = "pool not active"
        elif a.member and value == 0:
            want = "no value sent"
        elif not a.member and a.stake + value < MIN_STAKE:
            want = "stake below pool minimum"
        self.send(want, "join", self.pool, sender=who, value=value)
        if want is None:
            if not a.member:
                a.member, a.unbonding_until = True, 0
            a.stake += value
            self.m.paid_in += value

    @rule(who=ANYONE)
    def leave(self, who: str) -> None:
        a = self.m.accounts[who]
        want = None if a.member else "not a member"
        until = self.send(want, "leave", self.pool, sender=who)
        if want is None:
            a.member, a.unbonding_until = False, self.block + UNBONDING
            assert until == a.unbonding_until

    @rule(caller=AN_OWNER, who=A_WORKER)
    def eject(self, caller: str, who: str) -> None:
        a = self.m.accounts[who]
        want = self._owner_only(caller) or (None if a.member else "not a member")
        self.send(want, "eject", self.pool, self.addr[who], "silent", sender=caller)
        self.touched.add(who)
        if want is None:
            a.member, a.unbonding_until = False, self.block + UNBONDING

    @rule(who=ANYONE)
    def withdraw(self, who: str) -> None:
        a = self.m.accounts[who]
        want = None
        if a.member:
            want = "still a member"
        elif a.stake == 0:
            want = "nothing to withdraw"
        elif self.block < a.unbonding_until:
            want = "still unbonding"
        paid = self.send(want, "withdraw", self.pool, sender=who)
        if want is None:
            assert paid == a.stake
            self.m.paid_out += a.stake
            a.stake, a.unbonding_until = 0, 0

    @rule(who=ANYONE, value=VALUES)
    def fund_pool(self, who: str, value: int) -> None:
        want = None if value > 0 else "no value sent"
        self.send(want, "fund_pool", self.pool, sender=who, value=value)
        if want is None:
            self.m.funds += value
            self.m.paid_in += value

    @rule(caller=AN_OWNER, v=ANYONE, add=st.booleans())
    def set_validator(self, caller: str, v: str, add: bool) -> None:
        is_v = v in self.m.validators
        want = self._owner_only(caller)
        if want is None and add and is_v:
            want = "already a validator"
        if want is None and not add and not is_v:
            want = "not a validator"
        fn = "register_validator" if add else "remove_validator"
        self.send(want, fn, self.pool, self.addr[v], sender=caller)
        self.touched.add(v)
        if want is None:
            (self.m.validators.add if add else self.m.validators.discard)(v)

    @rule(caller=AN_OWNER, which=st.sampled_from(("activate", "end", "policy", "url", "trainer")))
    def owner_setting(self, caller: str, which: str) -> None:
        want = self._owner_only(caller)
        if which == "activate":
            want = want or (None if self.m.status == "pending" else "pool not pending")
            self.send(want, "activate_pool", self.pool, sender=caller)
        elif which == "end":
            # Rare (one draw in five of a rare rule) and late, so runs mostly test an open pool.
            if len(self.m.batches) < 4:
                return
            want = want or (None if self.m.status != "ended" else "pool already ended")
            self.send(want, "end_pool", self.pool, sender=caller)
            if want is None:
                self.m.status = "ended"
        elif which == "policy":
            want = want or (None if self.m.status == "pending" else "pool not pending")
            self.send(want, "set_slash_policy", self.pool, 0, True, sender=caller)
        elif which == "url":
            self.send(want, "set_orchestrator_url", self.pool, "http://other", sender=caller)
        else:
            self.send(want, "set_trainer", self.pool, self.addr["stranger"], sender=caller)

    @rule(caller=A_VALIDATOR, items=ITEMS, wait=WAITS)
    def attest_work(self, caller: str, items: list[tuple[str, int, int]], wait: int) -> None:
        """A batch as a validator's queue mixes it, `wait` blocks after the last step: the
        wait decides which reward epochs a worker's credits fall in."""
        self.advance(wait)
        self._attest(caller, items)

    @rule(
        caller=A_VALIDATOR, who=A_WORKER, first=st.integers(0, 40), n=st.integers(1, 5), wait=WAITS
    )
    def attest_a_run(self, caller: str, who: str, first: int, n: int, wait: int) -> None:
        """One worker's consecutive work ids, as the orchestrator hands them out."""
        self.advance(wait)
        self._attest(caller, [(who, first + i, 1 + i % 3) for i in range(n)])

    def _attest(self, caller: str, items: list[tuple[str, int, int]]) -> None:
        want = None
        if caller not in self.m.validators:
            want = "not a validator"
        elif self.m.status == "pending":
            want = "pool not active"
        else:
            for _, work_id, units in items:
                if units == 0:
                    want = "zero units"
                    break
                if work_id >= WORK_ID_LIMIT:
                    want = "work id too large"
                    break
        batch_id = self.send(
            want, "attest_work", self.pool,
            [self.addr[w] for w, _, _ in items], [i for _, i, _ in items], [u for _, _, u in items],
            sender=caller,
        )  # fmt: skip
        self.touched.update(w for w, _, _ in items)
        if want is not None:
            return
        credited = []
        for who, work_id, units in items:
            a = self.m.accounts[who]
            # A worker slashed below the minimum, like one who left, earns nothing more.
            if not a.member or a.stake < MIN_STAKE or work_id in a.settled:
                continue
            a.settled.add(work_id)
            a.units += units
            a.id_floor = max(a.id_floor, work_id + 1)
            epoch = self.block // CHALLENGE
            a.pending[epoch] = a.pending.get(epoch, 0) + units * RATE
            credited.append(Work(self.addr[who], work_id, units))
        if credited:
            self.m.batches.append(Batch(self.block, credited))
        assert batch_id == (len(self.m.batches) if credited else 0)

    @rule(caller=A_VALIDATOR, who=A_WORKER, work_id=WORK_IDS, fraction=FRACTIONS)
    def slash(self, caller: str, who: str, work_id: int, fraction: int) -> None:
        a = self.m.accounts[who]
        amount = a.stake * fraction // 100 or fraction
        want = None
        if caller not in self.m.validators:
            want = "not a validator"
        elif work_id >= WORK_ID_LIMIT:
            want = "work id too large"
        elif work_id in a.settled:
            want = "work already settled"
        else:
            want = self.m.take_stake(who, caller, amount)
        taken = self.send(
            want, "slash", self.pool, self.addr[who], work_id, amount, "bad", sender=caller
        )
        self.touched.add(who)
        if want is None:
            assert taken == amount
            a.settled.add(work_id)
            a.id_floor = max(a.id_floor, work_id + 1)

    @rule(caller=A_VALIDATOR, pick=st.integers(0, 2**16), tamper=st.booleans(), fraction=FRACTIONS)
    def dispute(self, caller: str, pick: int, tamper: bool, fraction: int) -> None:
        if not self.m.batches:
            return
        batch_id = pick % (len(self.m.batches) + 1) + 1  # one past the last: an unknown batch
        batch = self.m.batches[batch_id - 1] if batch_id <= len(self.m.batches) else None
        items = batch.items if batch else self.m.batches[-1].items
        index = pick % len(items)
        item = items[index]
        who = self.name[item.worker]
        a = self.m.accounts[who]
        units = item.units + 1 if tamper else item.units
        amount = a.stake * fraction // 100 or fraction
        leaf = merkle.leaf(self.pool, Work(item.worker, item.work_id, units))
        epoch, reward = (batch.block // CHALLENGE if batch else 0), units * RATE
        want = None
        if caller not in self.m.validators:
            want = "not a validator"
        elif batch is None:
            want = "unknown batch"
        elif self.block >= batch.block + CHALLENGE:
            want = "challenge window closed"
        elif leaf in self.m.disputed:
            want = "already disputed"
        elif tamper:
            want = "invalid merkle proof"
        elif a.pending.get(epoch, 0) < reward:
            want = "reward not pending"
        else:
            stake, funds, burnt, out = a.stake, self.m.funds, self.m.burnt, self.m.paid_out
            want = self.m.take_stake(who, caller, amount)
            if want is not None:  # the whole transaction reverts: nothing was taken
                a.stake, self.m.funds, self.m.burnt, self.m.paid_out = stake, funds, burnt, out
        taken = self.send(
            want, "dispute", self.pool, batch_id, item.worker, item.work_id, units,
            merkle.proof(self.pool, items, index), amount, "bad", sender=caller,
        )  # fmt: skip
        self.touched.add(who)
        if want is None:
            assert taken == amount
            self.m.disputed.add(leaf)
            a.pending[epoch] -= reward
            a.units -= units

    @rule(who=A_WORKER)
    def claim_rewards(self, who: str) -> None:
        a = self.m.accounts[who]
        total = a.claimable + self.m.matured(a, self.block)
        want = None
        if total == 0:
            want = "no matured rewards"
        elif self.m.funds == 0:
            want = "pool has no funds"
        paid = self.send(want, "claim_rewards", self.pool, sender=who)
        if want is None:
            amount = min(total, self.m.funds)
            assert paid == amount
            a.pending = {e: v for e, v in a.pending.items() if self.block < (e + 2) * CHALLENGE}
            a.claimable = total - amount
            a.claimed += amount
            self.m.funds -= amount
            self.m.paid_out += amount

    @rule(blocks=st.sampled_from((1, CHALLENGE, 2 * CHALLENGE, UNBONDING)))
    def advance(self, blocks: int) -> None:
        if blocks:
            boa.env.time_travel(blocks=blocks)

    # --- invariants ---

    @invariant()
    def the_books_balance(self) -> None:
        held = boa.env.get_balance(self.c.address)
        stakes = sum(a.stake for a in self.m.accounts.values())
        assert held == stakes + self.m.funds + self.m.burnt, "ether held != stakes + funds + burnt"
        assert held == self.m.paid_in - self.m.paid_out, "ether held != paid in - paid out"
        assert self.c.pool_state(self.pool) == (
            {"pending": 1, "active": 2, "ended": 3}[self.m.status],
            self.m.funds,
            self.m.reporter_bps,
            self.m.burn_slashed,
        ), "pool state"
        assert self.c.burnt(self.pool) == self.m.burnt, "burnt"
        units = sum(a.units for a in self.m.accounts.values())
        assert self.c.total_attested_units(self.pool) == units, "total attested units"
        assert self.c.batch_count(self.pool) == len(self.m.batches), "batch count"

    @invariant()
    def the_touched_accounts_match(self) -> None:
        # Every account every tenth step: a bug may touch one the step did not name.
        self.steps += 1
        for who in ACTORS if self.steps % 10 == 0 else self.touched:
            self._check_account(who)
        self.touched.clear()

    def _check_account(self, who: str) -> None:
        a, addr, pool = self.m.accounts[who], self.addr[who], self.pool
        assert self.c.stake_of(pool, addr) == a.stake, f"{who}: stake"
        assert self.c.is_member(pool, addr) == a.member, f"{who}: membership"
        assert self.c.unbonding_until(pool, addr) == a.unbonding_until, f"{who}: unbonding"
        assert self.c.is_validator(pool, addr) == (who in self.m.validators), f"{who}: validator"
        assert self.c.work_units(pool, addr) == a.units, f"{who}: attested units"
        assert self.c.work_id_floor(pool, addr) == a.id_floor, f"{who}: work id floor"
        rewards = self.c.rewards_of(pool, addr)
        assert rewards == self.m.rewards_of(a, self.block), f"{who}: rewards (claimable, pending)"
        # Paid, claimable and pending together are the attested units at the rate, exactly.
        assert a.claimed + sum(rewards) == RATE * a.units, f"{who}: rewards != units x rate"


def machine_for(source: str) -> type[LedgerMachine]:
    """The machine driving `source` (a planted-bug copy) instead of the real contract."""
    return type("PlantedLedgerMachine", (LedgerMachine,), {"source": source})
