# pragma version ~=0.4.3
# pragma evm-version cancun
# pragma optimize gas
"""
@title Prime Swarm ledger
@license MIT
@notice The on-chain registry of Prime Swarm: pools, worker stakes, the
        validator registry, attested work, slashing and rewards.
        One contract holds every pool so that a worker needs only a pool
        id and an RPC URL to find a pool's orchestrator and the address
        that signs its policies.
@dev Design decisions, fixed here so that off-chain code can rely on them:
     - A work key (e.g. keccak256 of a rollout id) lives in exactly one of
       three states per pool: none -> attested, or none -> slashed. It never
       leaves attested or slashed, so a key is paid at most once and a
       slashed key can never be paid.
     - `attest_work` SKIPS (does not revert on) entries whose key is already
       attested or slashed, or whose worker is not a member, and logs
       `WorkSkipped` for each. A validator that retries a batch after a lost
       receipt, or that races another validator, therefore cannot double-pay
       and does not lose the rest of the batch; a worker who leaves cannot
       block a batch that names them. Malformed input (ragged arrays, zero
       units) still reverts because it is a validator bug, not a race.
     - `slash` REVERTS on a key that is already attested or slashed: it is a
       single deliberate act, and a silent no-op would hide a conflict
       between validators.
     - Slashed stake goes to the pool's reward funds, so a cheater's stake
       pays honest workers rather than the operator.
     - Rewards are credited at attestation time whether or not the pool is
       funded; `claim_rewards` pays what the funds cover and leaves the rest
       of the balance claimable later.
     - A worker who leaves keeps earned rewards.
     - Leaving is in two steps so that stake backs work until every verdict
       on it can have landed. `leave` ends membership at once (no new work
       is attested, the orchestrator treats the worker as gone) but keeps
       the stake in `stake_of`, where `slash` still reaches it; `withdraw`
       pays it out from UNBONDING_BLOCKS blocks later on. Without the delay
       a worker could leave in the block before a pending slash and the
       slash would take nothing. The delay is in blocks, not seconds,
       because a block producer can skew `block.timestamp` but not
       `block.number`; deployers convert from their chain's block time. A
       value of 0 lets a worker withdraw in the block it leaves, i.e. turns
       the protection off.
     - `join` during (or after) unbonding re-joins: the unbonding is
       cancelled and the remaining stake counts toward the pool minimum, so
       a worker who changes their mind need not withdraw and re-send.
     - Each pool names its trainer: the address whose signatures on policy
       manifests workers and validators accept. It lives on chain, set by
       the pool owner, so that nobody has to take it from the orchestrator,
       which is the party a worker trusts least.
"""


# Largest batch `attest_work` accepts; bounds the gas of one call.
MAX_BATCH: public(constant(uint256)) = 64

# Basis-point denominator for the slash fraction.
BPS: constant(uint256) = 10_000

# Per-pool state of a work key. Values are part of the ABI (see
# `work_status`) and mirrored by the Python client.
WORK_NONE: constant(uint8) = 0
WORK_ATTESTED: constant(uint8) = 1
WORK_SLASHED: constant(uint8) = 2

# `WorkSkipped.reason` values. 1 and 2 equal the key's state on purpose.
SKIP_ALREADY_ATTESTED: constant(uint8) = 1
SKIP_ALREADY_SLASHED: constant(uint8) = 2
SKIP_NOT_MEMBER: constant(uint8) = 3


struct Pool:
    owner: address
    orchestrator_url: String[256]
    # Signer of the pool's policy manifests; never the zero address.
    trainer: address
    min_stake: uint256
    reward_per_unit: uint256
    # Unallocated ether that pays `claim_rewards`.
    funds: uint256


event PoolCreated:
    pool_id: indexed(uint256)
    owner: indexed(address)
    orchestrator_url: String[256]
    min_stake: uint256
    reward_per_unit: uint256
    trainer: address

event OrchestratorUrlChanged:
    pool_id: indexed(uint256)
    orchestrator_url: String[256]

event TrainerChanged:
    pool_id: indexed(uint256)
    previous: address
    trainer: address

event PoolFunded:
    pool_id: indexed(uint256)
    funder: indexed(address)
    amount: uint256
    funds: uint256

event WorkerJoined:
    pool_id: indexed(uint256)
    worker: indexed(address)
    stake: uint256

event StakeAdded:
    pool_id: indexed(uint256)
    worker: indexed(address)
    amount: uint256
    stake: uint256

# The stake stays in the pool, slashable, until block `unbonding_until`.
event WorkerLeft:
    pool_id: indexed(uint256)
    worker: indexed(address)
    stake: uint256
    unbonding_until: uint256

# Membership ended by the pool owner; the stake unbonds exactly as after `leave`.
event WorkerEjected:
    pool_id: indexed(uint256)
    worker: indexed(address)
    stake: uint256
    unbonding_until: uint256
    reason: String[64]

event StakeWithdrawn:
    pool_id: indexed(uint256)
    worker: indexed(address)
    amount: uint256

event ValidatorRegistered:
    pool_id: indexed(uint256)
    validator: indexed(address)

event ValidatorRemoved:
    pool_id: indexed(uint256)
    validator: indexed(address)

event WorkAttested:
    pool_id: indexed(uint256)
    worker: indexed(address)
    work_key: indexed(bytes32)
    validator: address
    units: uint256
    reward: uint256

# Not a state change: tells the validator which entries of a batch had no
# effect and why (see the SKIP_* constants).
event WorkSkipped:
    pool_id: indexed(uint256)
    worker: indexed(address)
    work_key: indexed(bytes32)
    validator: address
    reason: uint8

event WorkerSlashed:
    pool_id: indexed(uint256)
    worker: indexed(address)
    work_key: indexed(bytes32)
    validator: address
    amount: uint256
    reason: String[64]

event RewardsClaimed:
    pool_id: indexed(uint256)
    worker: indexed(address)
    amount: uint256
    remaining: uint256


# Fraction of a worker's stake taken by one slash, in basis points.
SLASH_BPS: public(immutable(uint256))

# Blocks between `leave` and the first block `withdraw` pays out.
UNBONDING_BLOCKS: public(immutable(uint256))

# Ids are 1-based so that 0 can mean "no pool" off chain.
pool_count: public(uint256)
_pools: HashMap[uint256, Pool]

is_member: public(HashMap[uint256, HashMap[address, bool]])
# A member's stake, or a former member's stake that is unbonding or not yet
# withdrawn; slashable in both cases.
stake_of: public(HashMap[uint256, HashMap[address, uint256]])
# First block at which a worker who left may withdraw; 0 while a member or
# after a withdrawal.
unbonding_until: public(HashMap[uint256, HashMap[address, uint256]])
is_validator: public(HashMap[uint256, HashMap[address, bool]])

work_status: public(HashMap[uint256, HashMap[bytes32, uint8]])
work_units: public(HashMap[uint256, HashMap[address, uint256]])
total_attested_units: public(HashMap[uint256, uint256])
reward_balance: public(HashMap[uint256, HashMap[address, uint256]])


@deploy
def __init__(slash_bps: uint256, unbonding_blocks: uint256):
    """
    @param slash_bps Share of a worker's stake one slash takes, in basis
           points (1000 = 10%).
    @param unbonding_blocks Blocks a worker's stake stays slashable after
           `leave`; longer than the slowest verdict the pool expects.
    """
    assert slash_bps <= BPS, "slash_bps above 10000"
    SLASH_BPS = slash_bps
    UNBONDING_BLOCKS = unbonding_blocks


# --- pools ------------------------------------------------------------------


@external
def create_pool(
    orchestrator_url: String[256],
    min_stake: uint256,
    reward_per_unit: uint256,
    trainer: address,
) -> uint256:
    """
    @notice Open a pool owned by the caller.
    @param trainer The address that signs the pool's policy manifests.
    @return The new pool's id (starting at 1).
    """
    assert len(orchestrator_url) > 0, "empty orchestrator url"
    assert trainer != empty(address), "zero trainer"
    pool_id: uint256 = self.pool_count + 1
    self.pool_count = pool_id
    self._pools[pool_id] = Pool(
        owner=msg.sender,
        orchestrator_url=orchestrator_url,
        trainer=trainer,
        min_stake=min_stake,
        reward_per_unit=reward_per_unit,
        funds=0,
    )
    log PoolCreated(
        pool_id=pool_id,
        owner=msg.sender,
        orchestrator_url=orchestrator_url,
        min_stake=min_stake,
        reward_per_unit=reward_per_unit,
        trainer=trainer,
    )
    return pool_id


@external
def set_orchestrator_url(pool_id: uint256, orchestrator_url: String[256]):
    self._check_owner(pool_id)
    assert len(orchestrator_url) > 0, "empty orchestrator url"
    self._pools[pool_id].orchestrator_url = orchestrator_url
    log OrchestratorUrlChanged(pool_id=pool_id, orchestrator_url=orchestrator_url)


@external
def set_trainer(pool_id: uint256, trainer: address):
    """
    @notice Name a new signer of the pool's policy manifests (e.g. after a
            key rotation). Owner only: whoever sets it decides which
            policies workers run.
    """
    self._check_owner(pool_id)
    assert trainer != empty(address), "zero trainer"
    previous: address = self._pools[pool_id].trainer
    self._pools[pool_id].trainer = trainer
    log TrainerChanged(pool_id=pool_id, previous=previous, trainer=trainer)


@external
@payable
def fund_pool(pool_id: uint256):
    """
    @notice Add ether to a pool's reward funds. Open to anyone: funds can
            only ever leave as worker rewards, so a donation harms no one.
    """
    self._check_pool(pool_id)
    assert msg.value > 0, "no value sent"
    funds: uint256 = self._pools[pool_id].funds + msg.value
    self._pools[pool_id].funds = funds
    log PoolFunded(pool_id=pool_id, funder=msg.sender, amount=msg.value, funds=funds)


@view
@external
def pool(pool_id: uint256) -> (address, String[256], uint256, uint256, address):
    """
    @return owner, orchestrator_url, min_stake, reward_per_unit, trainer
    """
    self._check_pool(pool_id)
    p: Pool = self._pools[pool_id]
    return p.owner, p.orchestrator_url, p.min_stake, p.reward_per_unit, p.trainer


@view
@external
def pool_funds(pool_id: uint256) -> uint256:
    self._check_pool(pool_id)
    return self._pools[pool_id].funds


# --- stakes -----------------------------------------------------------------


@external
@payable
def join(pool_id: uint256):
    """
    @notice Stake into a pool. A non-member becomes a member if its stake
            (what is left from before, if it is unbonding, plus msg.value)
            reaches the pool's minimum; this cancels any unbonding. A member
            tops its stake up (e.g. after a slash).
    """
    self._check_pool(pool_id)
    stake: uint256 = self.stake_of[pool_id][msg.sender] + msg.value
    if self.is_member[pool_id][msg.sender]:
        assert msg.value > 0, "no value sent"
        self.stake_of[pool_id][msg.sender] = stake
        log StakeAdded(pool_id=pool_id, worker=msg.sender, amount=msg.value, stake=stake)
        return
    assert stake >= self._pools[pool_id].min_stake, "stake below pool minimum"
    self.is_member[pool_id][msg.sender] = True
    self.stake_of[pool_id][msg.sender] = stake
    self.unbonding_until[pool_id][msg.sender] = 0
    log WorkerJoined(pool_id=pool_id, worker=msg.sender, stake=stake)


@external
def leave(pool_id: uint256) -> uint256:
    """
    @notice Leave a pool: membership ends now, the stake unbonds. It stays
            slashable for UNBONDING_BLOCKS blocks and is then paid out by
            `withdraw`. Earned rewards stay claimable.
    @return The block from which `withdraw` pays out.
    """
    assert self.is_member[pool_id][msg.sender], "not a member"
    until: uint256 = self._start_unbonding(pool_id, msg.sender)
    log WorkerLeft(
        pool_id=pool_id,
        worker=msg.sender,
        stake=self.stake_of[pool_id][msg.sender],
        unbonding_until=until,
    )
    return until


@external
def eject(pool_id: uint256, worker: address, reason: String[64]) -> uint256:
    """
    @notice The pool owner ends a worker's membership, e.g. one that stopped
            answering heartbeats: the same unbonding as `leave`, no slash.
            Misbehaviour is answered by `slash`, not here: ejection takes
            nothing, so an owner cannot profit from it.
    @return The block from which the worker's `withdraw` pays out.
    """
    self._check_owner(pool_id)
    assert self.is_member[pool_id][worker], "not a member"
    until: uint256 = self._start_unbonding(pool_id, worker)
    log WorkerEjected(
        pool_id=pool_id,
        worker=worker,
        stake=self.stake_of[pool_id][worker],
        unbonding_until=until,
        reason=reason,
    )
    return until


@external
@nonreentrant
def withdraw(pool_id: uint256) -> uint256:
    """
    @notice Take back the stake of a pool the caller left, once its
            unbonding has ended; what slashes took during unbonding is gone.
    @return The ether paid.
    """
    assert not self.is_member[pool_id][msg.sender], "still a member"
    stake: uint256 = self.stake_of[pool_id][msg.sender]
    assert stake > 0, "nothing to withdraw"
    assert block.number >= self.unbonding_until[pool_id][msg.sender], "still unbonding"
    self.stake_of[pool_id][msg.sender] = 0
    self.unbonding_until[pool_id][msg.sender] = 0
    log StakeWithdrawn(pool_id=pool_id, worker=msg.sender, amount=stake)
    # State is settled before the transfer, and the lock covers the rest.
    raw_call(msg.sender, b"", value=stake)
    return stake


# --- validators -------------------------------------------------------------


@external
def register_validator(pool_id: uint256, validator: address):
    self._check_owner(pool_id)
    assert validator != empty(address), "zero address"
    assert not self.is_validator[pool_id][validator], "already a validator"
    self.is_validator[pool_id][validator] = True
    log ValidatorRegistered(pool_id=pool_id, validator=validator)


@external
def remove_validator(pool_id: uint256, validator: address):
    self._check_owner(pool_id)
    assert self.is_validator[pool_id][validator], "not a validator"
    self.is_validator[pool_id][validator] = False
    log ValidatorRemoved(pool_id=pool_id, validator=validator)


# --- work -------------------------------------------------------------------


@external
def attest_work(
    pool_id: uint256,
    workers: DynArray[address, MAX_BATCH],
    work_keys: DynArray[bytes32, MAX_BATCH],
    units: DynArray[uint256, MAX_BATCH],
) -> uint256:
    """
    @notice Record verified work and credit its reward. Entries whose key is
            already attested or slashed, or whose worker is not a member, are
            skipped with a `WorkSkipped` event (see the module notes).
    @return The number of entries attested.
    """
    assert self.is_validator[pool_id][msg.sender], "not a validator"
    n: uint256 = len(workers)
    assert len(work_keys) == n and len(units) == n, "array lengths differ"
    rate: uint256 = self._pools[pool_id].reward_per_unit

    attested: uint256 = 0
    total_units: uint256 = 0
    for i: uint256 in range(n, bound=MAX_BATCH):
        worker: address = workers[i]
        key: bytes32 = work_keys[i]
        amount: uint256 = units[i]
        assert amount > 0, "zero units"

        status: uint8 = self.work_status[pool_id][key]
        if status != WORK_NONE:
            log WorkSkipped(
                pool_id=pool_id, worker=worker, work_key=key, validator=msg.sender, reason=status
            )
            continue
        if not self.is_member[pool_id][worker]:
            log WorkSkipped(
                pool_id=pool_id,
                worker=worker,
                work_key=key,
                validator=msg.sender,
                reason=SKIP_NOT_MEMBER,
            )
            continue

        reward: uint256 = amount * rate
        self.work_status[pool_id][key] = WORK_ATTESTED
        self.work_units[pool_id][worker] += amount
        self.reward_balance[pool_id][worker] += reward
        total_units += amount
        attested += 1
        log WorkAttested(
            pool_id=pool_id,
            worker=worker,
            work_key=key,
            validator=msg.sender,
            units=amount,
            reward=reward,
        )

    # One write for the whole batch instead of one per entry.
    if total_units > 0:
        self.total_attested_units[pool_id] += total_units
    return attested


@external
def slash(pool_id: uint256, worker: address, work_key: bytes32, reason: String[64]) -> uint256:
    """
    @notice Punish rejected work: take SLASH_BPS of the worker's stake into
            the pool's reward funds and mark the key so it can never be paid.
            A worker who left is slashable until it withdraws (see the
            module notes). Reverts if the key is already attested or
            slashed.
    @return The ether slashed (0 if the worker has no stake left).
    """
    assert self.is_validator[pool_id][msg.sender], "not a validator"
    status: uint8 = self.work_status[pool_id][work_key]
    assert status != WORK_ATTESTED, "work key already attested"
    assert status != WORK_SLASHED, "work key already slashed"

    stake: uint256 = self.stake_of[pool_id][worker]
    amount: uint256 = stake * SLASH_BPS // BPS
    self.work_status[pool_id][work_key] = WORK_SLASHED
    self.stake_of[pool_id][worker] = stake - amount
    self._pools[pool_id].funds += amount
    log WorkerSlashed(
        pool_id=pool_id,
        worker=worker,
        work_key=work_key,
        validator=msg.sender,
        amount=amount,
        reason=reason,
    )
    return amount


# --- rewards ----------------------------------------------------------------


@external
@nonreentrant
def claim_rewards(pool_id: uint256) -> uint256:
    """
    @notice Pay the caller's reward balance from the pool's funds, as far as
            the funds go; the unpaid rest stays in the balance.
    @return The ether paid.
    """
    balance: uint256 = self.reward_balance[pool_id][msg.sender]
    assert balance > 0, "no rewards to claim"
    funds: uint256 = self._pools[pool_id].funds
    assert funds > 0, "pool has no funds"
    amount: uint256 = min(balance, funds)
    self.reward_balance[pool_id][msg.sender] = balance - amount
    self._pools[pool_id].funds = funds - amount
    log RewardsClaimed(
        pool_id=pool_id, worker=msg.sender, amount=amount, remaining=balance - amount
    )
    raw_call(msg.sender, b"", value=amount)
    return amount


# --- internal ---------------------------------------------------------------


@internal
def _start_unbonding(pool_id: uint256, worker: address) -> uint256:
    until: uint256 = block.number + UNBONDING_BLOCKS
    self.is_member[pool_id][worker] = False
    self.unbonding_until[pool_id][worker] = until
    return until


@view
@internal
def _check_pool(pool_id: uint256):
    # Pools never lose their owner, so a zero owner means "no such pool".
    assert self._pools[pool_id].owner != empty(address), "unknown pool"


@view
@internal
def _check_owner(pool_id: uint256):
    self._check_pool(pool_id)
    assert self._pools[pool_id].owner == msg.sender, "not the pool owner"
