# pragma version ~=0.4.3
# pragma evm-version cancun
# pragma optimize gas
"""
@title Prime Swarm ledger
@license MIT
@notice The on-chain registry of Prime Swarm: pools and their lifecycle,
        worker stakes, the validator set, attested work committed by Merkle
        root, disputes, slashing and rewards. One contract holds every pool
        so that a worker needs only a pool id and an RPC URL to find a
        pool's orchestrator and the address that signs its policies.
@dev Design decisions, fixed here so that off-chain code can rely on them:

     Work identity and duplicates
     - A unit of work is named by (worker, work_id): `work_id` is the
       orchestrator's per-worker sequence number, handed out with each lease
       (0, 1, 2, ... for each worker of a pool). Each (pool, worker, work_id)
       is settled at most once, either attested or slashed, and never leaves
       that state: a work item is paid at most once and slashed work can
       never be paid.
     - "Settled" is one bit in a per-worker bitmap: word `work_id >> 8`, bit
       `work_id & 255`. Because a worker's ids are consecutive, 256 of its
       items share one storage slot, and a batch touches one slot per
       worker in the common case instead of one per item (the reason a
       batch of 64 costs a few thousand gas per item, not 20k+). Limits: the
       check is exact (no false positives, unlike a Bloom filter), but its
       cost depends on density. Ids spread far apart (an orchestrator that
       lost its counter and restarted from a random base) still work and are
       still refused when repeated, at up to one slot per item. An
       orchestrator that restarts its counter from 0 would see its honest
       work refused as duplicates, never paid twice: it resumes from
       `work_id_high` (the highest id settled per worker) instead.
     - Batches are committed, not stored: `attest_work` keeps the Merkle
       root of the items it credited (leaf = keccak256(abi_encode(pool_id,
       worker, work_id, units)), pairs hashed in sorted order, an odd node
       carried up unchanged). Any item can be proven against the root later
       (`verify_item`, `dispute`); the items themselves are in the
       transaction's calldata for anyone to rebuild the tree. The full root
       is in the `BatchAttested` event; storage keeps its high 192 bits
       next to the block number (one slot per batch). Leaves hash
       128 bytes and inner nodes 64, so an inner node cannot pass as a leaf.
     - `attest_work` SKIPS (does not revert on) items already settled or
       whose worker is not a member, with a `WorkSkipped` event each: a
       validator retrying a batch after a lost receipt, or racing another
       validator, cannot double-pay and does not lose the rest of its batch.
       Malformed input (ragged arrays, zero units) reverts: a validator bug.
     - `slash` and `dispute` REVERT on conflicts: each is a single
       deliberate act, and a silent no-op would hide a disagreement between
       validators.

     Economics
     - A pool is PENDING (the owner sets validators and the slash policy),
       then ACTIVE (workers join, work is attested), then ENDED (no joins;
       work leased before the end is still attested, disputed, slashed and
       paid; stakes unbond as usual).
     - Rewards are credited at attestation (units * reward_per_unit) but can
       only be claimed after the challenge window: a credit in epoch
       e = block // CHALLENGE_BLOCKS matures at block (e + 2) *
       CHALLENGE_BLOCKS, strictly later than the last block at which its
       batch can be disputed (batch block + CHALLENGE_BLOCKS - 1). So each
       worker has at most two unmatured epochs, kept in two buckets: no
       loop, no per-batch storage per worker.
     - A dispute proves an attested item against its batch root within the
       window, reverses its units and reward and slashes the worker.
     - A slash (of rejected work, or by dispute) takes an amount of the
       worker's stake, at most SLASH_BPS of it. The pool's `reporter_bps`
       share goes to the reporting validator, the rest to the pool's reward
       funds or, if the pool chose so, is burnt (kept locked in this
       contract forever, counted in `burnt`).
     - Claims pay what the pool's funds cover and leave the rest claimable.
       A worker who leaves or is ejected keeps earned rewards.
     - Leaving is in two steps so that stake backs work until every verdict
       on it can have landed: `leave` (or the owner's `eject`) ends
       membership at once, the stake stays slashable for UNBONDING_BLOCKS,
       then `withdraw` pays it. UNBONDING_BLOCKS >= CHALLENGE_BLOCKS, so a
       dispute can always still reach the stake behind the disputed work.
       Counted in blocks, not seconds: a block producer can skew
       `block.timestamp` but not `block.number`.
     - Each pool names its trainer: the address whose signatures on policy
       manifests workers and validators accept. It lives on chain, set by
       the owner, so that nobody has to take it from the orchestrator.
     - Value leaves only by `withdraw`, `claim_rewards` and the reporter's
       share of a slash; each settles state first and holds the lock.
"""


# Largest batch `attest_work` accepts; bounds the gas of one call.
MAX_BATCH: public(constant(uint256)) = 256

# Longest Merkle proof `dispute` accepts: ceil(log2(MAX_BATCH)).
MAX_PROOF: constant(uint256) = 8

# Basis-point denominator for shares of a stake.
BPS: constant(uint256) = 10_000

# Pool status. Values are part of the ABI and mirrored by the Python client.
POOL_PENDING: constant(uint8) = 1
POOL_ACTIVE: constant(uint8) = 2
POOL_ENDED: constant(uint8) = 3

# Packed words (see the storage notes): low bit masks.
LOW64: constant(uint256) = 2**64 - 1
LOW128: constant(uint256) = 2**128 - 1
LOW192: constant(uint256) = 2**192 - 1

# `WorkSkipped.reason` values.
SKIP_SETTLED: constant(uint8) = 1
SKIP_NOT_MEMBER: constant(uint8) = 2
# A member a slash took below the pool's minimum stake: paid again after a
# top-up (`join`), so a slashed-out worker cannot keep earning on a dust stake.
SKIP_BELOW_MINIMUM: constant(uint8) = 3


struct Pool:
    owner: address
    orchestrator_url: String[256]
    # Signer of the pool's policy manifests; never the zero address.
    trainer: address
    min_stake: uint256
    reward_per_unit: uint256
    # Unallocated ether that pays `claim_rewards`.
    funds: uint256
    status: uint8
    # Share of each slash paid to the validator that reports it.
    reporter_bps: uint256
    # Whether the rest of a slash is burnt instead of added to `funds`.
    burn_slashed: bool


event PoolCreated:
    pool_id: indexed(uint256)
    owner: indexed(address)
    orchestrator_url: String[256]
    min_stake: uint256
    reward_per_unit: uint256
    trainer: address

event PoolStatusChanged:
    pool_id: indexed(uint256)
    status: uint8

event SlashPolicySet:
    pool_id: indexed(uint256)
    reporter_bps: uint256
    burn_slashed: bool

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

# One per batch: the commitment any item of it can be proven against.
event BatchAttested:
    pool_id: indexed(uint256)
    batch_id: indexed(uint256)
    validator: indexed(address)
    root: bytes32
    items: uint256
    units: uint256

# One per worker per batch (per run of consecutive items of that worker).
event WorkCredited:
    pool_id: indexed(uint256)
    worker: indexed(address)
    batch_id: indexed(uint256)
    items: uint256
    units: uint256
    reward: uint256

# Not a state change: tells the validator which items of a batch had no
# effect and why (see the SKIP_* constants).
event WorkSkipped:
    pool_id: indexed(uint256)
    worker: indexed(address)
    work_id: uint256
    validator: address
    reason: uint8

event WorkerSlashed:
    pool_id: indexed(uint256)
    worker: indexed(address)
    work_id: uint256
    validator: indexed(address)
    amount: uint256
    reporter_share: uint256
    burnt: uint256
    reason: String[64]

event WorkDisputed:
    pool_id: indexed(uint256)
    batch_id: indexed(uint256)
    worker: indexed(address)
    work_id: uint256
    validator: address
    units: uint256
    reward: uint256

event RewardsClaimed:
    pool_id: indexed(uint256)
    worker: indexed(address)
    amount: uint256
    remaining: uint256


# Largest share of a worker's stake one slash may take, in basis points.
SLASH_BPS: public(immutable(uint256))

# Blocks between `leave` and the first block `withdraw` pays out.
UNBONDING_BLOCKS: public(immutable(uint256))

# Blocks after an attestation during which it can be disputed; rewards
# mature after it (see the module notes). 0: no window, no disputes.
CHALLENGE_BLOCKS: public(immutable(uint256))

# Ids are 1-based so that 0 can mean "none" off chain.
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

# Storage a batch touches is packed so that it writes few slots: per worker
# one settled-bitmap word, one tally and one reward bucket; per pool one
# tally; per batch one word.

# Settled work ids, 256 per word (see the module notes).
settled_words: public(HashMap[uint256, HashMap[address, HashMap[uint256, uint256]]])
# Per worker: attested units (low 128 bits) | one past the highest settled
# work id (high 128 bits; 0: none yet), where an orchestrator that lost its
# counter resumes.
_worker_tally: HashMap[uint256, HashMap[address, uint256]]
# Per pool: batches so far (low 64 bits) | attested units (the rest).
_pool_tally: HashMap[uint256, uint256]
# Per batch: its Merkle root's high 192 bits | the block it was attested in
# (low 64 bits). One slot instead of two saves 22k gas a batch; proving an
# item against 192 bits of root still takes a 2**192 second preimage.
_batches: HashMap[uint256, HashMap[uint256, uint256]]
# Leaves already disputed, so one item is reversed at most once.
disputed: public(HashMap[uint256, HashMap[bytes32, bool]])

# Matured rewards, and two buckets of unmatured ones, each
# epoch (high 64 bits) | amount (low 192 bits); amount 0 is an empty bucket.
_claimable: HashMap[uint256, HashMap[address, uint256]]
_buckets: HashMap[uint256, HashMap[address, uint256[2]]]
# Slashed ether burnt per pool: locked in this contract for good.
burnt: public(HashMap[uint256, uint256])


@deploy
def __init__(slash_bps: uint256, unbonding_blocks: uint256, challenge_blocks: uint256):
    """
    @param slash_bps Largest share of a worker's stake one slash takes, in
           basis points (1000 = 10%).
    @param unbonding_blocks Blocks a worker's stake stays slashable after
           `leave`; longer than the slowest verdict the pool expects.
    @param challenge_blocks Blocks an attestation can be disputed for; at
           most `unbonding_blocks`.
    """
    assert slash_bps <= BPS, "slash_bps above 10000"
    assert challenge_blocks <= unbonding_blocks, "challenge window above unbonding"
    SLASH_BPS = slash_bps
    UNBONDING_BLOCKS = unbonding_blocks
    CHALLENGE_BLOCKS = challenge_blocks


# --- pools ------------------------------------------------------------------


@external
def create_pool(
    orchestrator_url: String[256],
    min_stake: uint256,
    reward_per_unit: uint256,
    trainer: address,
) -> uint256:
    """
    @notice Open a pool owned by the caller, PENDING until `activate_pool`.
            The slash policy starts at 10% to the reporter, the rest to the
            pool's funds.
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
        status=POOL_PENDING,
        reporter_bps=1_000,
        burn_slashed=False,
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
def set_slash_policy(pool_id: uint256, reporter_bps: uint256, burn_slashed: bool):
    """
    @notice Where slashed stake goes. Only while PENDING: workers join
            knowing the rules, and an owner cannot redirect slashes later.
    """
    self._check_owner(pool_id)
    assert self._pools[pool_id].status == POOL_PENDING, "pool not pending"
    assert reporter_bps <= BPS, "reporter_bps above 10000"
    self._pools[pool_id].reporter_bps = reporter_bps
    self._pools[pool_id].burn_slashed = burn_slashed
    log SlashPolicySet(pool_id=pool_id, reporter_bps=reporter_bps, burn_slashed=burn_slashed)


@external
def activate_pool(pool_id: uint256):
    self._check_owner(pool_id)
    assert self._pools[pool_id].status == POOL_PENDING, "pool not pending"
    self._pools[pool_id].status = POOL_ACTIVE
    log PoolStatusChanged(pool_id=pool_id, status=POOL_ACTIVE)


@external
def end_pool(pool_id: uint256):
    """
    @notice No more joins. Work already leased is still attested, disputed
            and paid; members leave and withdraw as usual.
    """
    self._check_owner(pool_id)
    assert self._pools[pool_id].status != POOL_ENDED, "pool already ended"
    self._pools[pool_id].status = POOL_ENDED
    log PoolStatusChanged(pool_id=pool_id, status=POOL_ENDED)


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
def pool_state(pool_id: uint256) -> (uint8, uint256, uint256, bool):
    """
    @return status, funds, reporter_bps, burn_slashed
    """
    self._check_pool(pool_id)
    p: Pool = self._pools[pool_id]
    return p.status, p.funds, p.reporter_bps, p.burn_slashed


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
    @notice Stake into an ACTIVE pool. A non-member becomes a member if its
            stake (what is left from before, if it is unbonding, plus
            msg.value) reaches the pool's minimum; this cancels any
            unbonding. A member tops its stake up (e.g. after a slash).
    """
    self._check_pool(pool_id)
    assert self._pools[pool_id].status == POOL_ACTIVE, "pool not active"
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
    work_ids: DynArray[uint256, MAX_BATCH],
    units: DynArray[uint256, MAX_BATCH],
) -> uint256:
    """
    @notice Record a batch of verified work, credit its rewards (claimable
            after the challenge window) and commit to the credited items by
            their Merkle root. Items already settled, or whose worker is not
            a member or holds less than the pool's minimum stake, are skipped
            with `WorkSkipped`. Sorting the batch by
            worker, then work id, makes it cheapest (one credit and one
            bitmap write per worker).
    @return The batch id, or 0 if every item was skipped.
    """
    assert self.is_validator[pool_id][msg.sender], "not a validator"
    assert self._pools[pool_id].status != POOL_PENDING, "pool not active"
    n: uint256 = len(workers)
    assert len(work_ids) == n and len(units) == n, "array lengths differ"
    rate: uint256 = self._pools[pool_id].reward_per_unit
    min_stake: uint256 = self._pools[pool_id].min_stake
    pool_tally: uint256 = self._pool_tally[pool_id]
    batch_id: uint256 = (pool_tally & LOW64) + 1

    # The tree's nodes, leaves first; the root is built in place below.
    nodes: bytes32[MAX_BATCH] = empty(bytes32[MAX_BATCH])
    count: uint256 = 0
    total_units: uint256 = 0
    # The run of consecutive items of one worker, credited in one write.
    run_worker: address = empty(address)
    run_skip: uint8 = 0
    run_items: uint256 = 0
    run_units: uint256 = 0
    run_floor: uint256 = 0
    # The bitmap word in hand, written back when the next item needs another.
    word_index: uint256 = max_value(uint256)
    word: uint256 = 0
    for i: uint256 in range(n, bound=MAX_BATCH):
        worker: address = workers[i]
        work_id: uint256 = work_ids[i]
        amount: uint256 = units[i]
        assert amount > 0, "zero units"
        # One past the highest id is kept in 128 bits (`_worker_tally`).
        assert work_id < LOW128, "work id too large"
        if worker != run_worker:
            if word_index != max_value(uint256):
                self.settled_words[pool_id][run_worker][word_index] = word
            self._credit_run(pool_id, batch_id, run_worker, run_items, run_units, run_floor, rate)
            word_index = max_value(uint256)
            run_worker = worker
            run_skip = 0
            if not self.is_member[pool_id][worker]:
                run_skip = SKIP_NOT_MEMBER
            elif self.stake_of[pool_id][worker] < min_stake:
                run_skip = SKIP_BELOW_MINIMUM
            run_items = 0
            run_units = 0
            run_floor = 0
        if run_skip != 0:
            log WorkSkipped(
                pool_id=pool_id,
                worker=worker,
                work_id=work_id,
                validator=msg.sender,
                reason=run_skip,
            )
            continue
        index: uint256 = work_id >> 8
        if index != word_index:
            if word_index != max_value(uint256):
                self.settled_words[pool_id][worker][word_index] = word
            word_index = index
            word = self.settled_words[pool_id][worker][index]
        bit: uint256 = 1 << (work_id & 255)
        if word & bit != 0:
            log WorkSkipped(
                pool_id=pool_id,
                worker=worker,
                work_id=work_id,
                validator=msg.sender,
                reason=SKIP_SETTLED,
            )
            continue
        word = word | bit
        nodes[count] = keccak256(abi_encode(pool_id, worker, work_id, amount))
        count += 1
        run_items += 1
        run_units += amount
        total_units += amount
        run_floor = max(run_floor, work_id + 1)
    if word_index != max_value(uint256):
        self.settled_words[pool_id][run_worker][word_index] = word
    self._credit_run(pool_id, batch_id, run_worker, run_items, run_units, run_floor, rate)
    if count == 0:
        return 0

    # Level by level, in place: node j of the level above overwrites node j,
    # which was already read (j <= 2j).
    width: uint256 = count
    for _: uint256 in range(MAX_PROOF):
        if width == 1:
            break
        for j: uint256 in range((width + 1) // 2, bound=MAX_BATCH // 2):
            if 2 * j + 1 < width:
                # _hash_pair, inlined: the call costs more than the hash here.
                a: bytes32 = nodes[2 * j]
                b: bytes32 = nodes[2 * j + 1]
                if convert(a, uint256) < convert(b, uint256):
                    nodes[j] = keccak256(concat(a, b))
                else:
                    nodes[j] = keccak256(concat(b, a))
            else:
                nodes[j] = nodes[2 * j]  # an odd node is carried up unchanged
        width = (width + 1) // 2
    root: bytes32 = nodes[0]

    self._pool_tally[pool_id] = pool_tally + 1 + (total_units << 64)
    self._batches[pool_id][batch_id] = (convert(root, uint256) & ~LOW64) | block.number
    log BatchAttested(
        pool_id=pool_id,
        batch_id=batch_id,
        validator=msg.sender,
        root=root,
        items=count,
        units=total_units,
    )
    return batch_id


@external
@nonreentrant
def slash(
    pool_id: uint256, worker: address, work_id: uint256, amount: uint256, reason: String[64]
) -> uint256:
    """
    @notice Punish rejected work: settle the item as slashed (it can never
            be paid) and take `amount` of the worker's stake, shared as the
            pool's slash policy says. A worker who left is slashable until
            it withdraws. Reverts if the item is already settled.
    @return The amount taken.
    """
    assert self.is_validator[pool_id][msg.sender], "not a validator"
    assert work_id < LOW128, "work id too large"
    index: uint256 = work_id >> 8
    bit: uint256 = 1 << (work_id & 255)
    word: uint256 = self.settled_words[pool_id][worker][index]
    assert word & bit == 0, "work already settled"
    self.settled_words[pool_id][worker][index] = word | bit
    tally: uint256 = self._worker_tally[pool_id][worker]
    if work_id + 1 > tally >> 128:
        self._worker_tally[pool_id][worker] = (tally & LOW128) | ((work_id + 1) << 128)
    return self._take_stake(pool_id, worker, work_id, amount, reason)


@external
@nonreentrant
def dispute(
    pool_id: uint256,
    batch_id: uint256,
    worker: address,
    work_id: uint256,
    units: uint256,
    proof: DynArray[bytes32, MAX_PROOF],
    amount: uint256,
    reason: String[64],
) -> uint256:
    """
    @notice Reverse an attested item inside its challenge window: prove it
            against its batch root, take back its units and reward (not yet
            claimable, by construction), and slash `amount` of the stake.
    @return The amount taken.
    """
    assert self.is_validator[pool_id][msg.sender], "not a validator"
    committed: uint256 = self._batches[pool_id][batch_id]
    assert committed != 0, "unknown batch"
    attested_at: uint256 = committed & LOW64
    assert block.number < attested_at + CHALLENGE_BLOCKS, "challenge window closed"
    leaf: bytes32 = keccak256(abi_encode(pool_id, worker, work_id, units))
    assert not self.disputed[pool_id][leaf], "already disputed"
    assert self._verify(leaf, proof, committed), "invalid merkle proof"
    self.disputed[pool_id][leaf] = True

    reward: uint256 = units * self._pools[pool_id].reward_per_unit
    if reward > 0:
        epoch: uint256 = attested_at // CHALLENGE_BLOCKS
        found: bool = False
        for i: uint256 in range(2):
            b: uint256 = self._buckets[pool_id][worker][i]
            if not found and b >> 192 == epoch and b & LOW192 >= reward:
                self._buckets[pool_id][worker][i] = b - reward
                found = True
        assert found, "reward not pending"
    self._worker_tally[pool_id][worker] -= units
    self._pool_tally[pool_id] -= units << 64
    log WorkDisputed(
        pool_id=pool_id,
        batch_id=batch_id,
        worker=worker,
        work_id=work_id,
        validator=msg.sender,
        units=units,
        reward=reward,
    )
    return self._take_stake(pool_id, worker, work_id, amount, reason)


@view
@external
def batch(pool_id: uint256, batch_id: uint256) -> (bytes32, uint256):
    """
    @return the root's high 192 bits (low 64 zero), the block it was attested
            in; both zero for an unknown batch
    """
    committed: uint256 = self._batches[pool_id][batch_id]
    return convert(committed & ~LOW64, bytes32), committed & LOW64


@view
@external
def verify_item(
    pool_id: uint256,
    batch_id: uint256,
    worker: address,
    work_id: uint256,
    units: uint256,
    proof: DynArray[bytes32, MAX_PROOF],
) -> bool:
    """
    @notice Whether (worker, work_id, units) was credited in the batch.
    """
    committed: uint256 = self._batches[pool_id][batch_id]
    if committed == 0:
        return False
    return self._verify(keccak256(abi_encode(pool_id, worker, work_id, units)), proof, committed)


@view
@external
def is_settled(pool_id: uint256, worker: address, work_id: uint256) -> bool:
    return self.settled_words[pool_id][worker][work_id >> 8] & (1 << (work_id & 255)) != 0


@view
@external
def work_units(pool_id: uint256, worker: address) -> uint256:
    return self._worker_tally[pool_id][worker] & LOW128


@view
@external
def work_id_floor(pool_id: uint256, worker: address) -> uint256:
    """
    @return One past the highest settled work id of `worker` (0: none).
    """
    return self._worker_tally[pool_id][worker] >> 128


@view
@external
def total_attested_units(pool_id: uint256) -> uint256:
    return self._pool_tally[pool_id] >> 64


@view
@external
def batch_count(pool_id: uint256) -> uint256:
    return self._pool_tally[pool_id] & LOW64


# --- rewards ----------------------------------------------------------------


@view
@external
def rewards_of(pool_id: uint256, worker: address) -> (uint256, uint256):
    """
    @return claimable now, still inside the challenge window
    """
    claimable: uint256 = self._claimable[pool_id][worker]
    pending: uint256 = 0
    for i: uint256 in range(2):
        b: uint256 = self._buckets[pool_id][worker][i]
        if self._is_mature(b):
            claimable += b & LOW192
        else:
            pending += b & LOW192
    return claimable, pending


@external
@nonreentrant
def claim_rewards(pool_id: uint256) -> uint256:
    """
    @notice Pay the caller's matured rewards from the pool's funds, as far
            as the funds go; the unpaid rest stays claimable.
    @return The ether paid.
    """
    claimable: uint256 = self._claimable[pool_id][msg.sender]
    for i: uint256 in range(2):
        b: uint256 = self._buckets[pool_id][msg.sender][i]
        if b & LOW192 > 0 and self._is_mature(b):
            claimable += b & LOW192
            self._buckets[pool_id][msg.sender][i] = 0
    assert claimable > 0, "no matured rewards"
    funds: uint256 = self._pools[pool_id].funds
    assert funds > 0, "pool has no funds"
    amount: uint256 = min(claimable, funds)
    self._claimable[pool_id][msg.sender] = claimable - amount
    self._pools[pool_id].funds = funds - amount
    log RewardsClaimed(
        pool_id=pool_id, worker=msg.sender, amount=amount, remaining=claimable - amount
    )
    raw_call(msg.sender, b"", value=amount)
    return amount


# --- internal ---------------------------------------------------------------


@internal
def _credit_run(
    pool_id: uint256,
    batch_id: uint256,
    worker: address,
    items: uint256,
    units: uint256,
    id_floor: uint256,
    rate: uint256,
):
    if items == 0:
        return
    tally: uint256 = self._worker_tally[pool_id][worker]
    assert (tally & LOW128) + units <= LOW128, "units overflow"
    self._worker_tally[pool_id][worker] = tally + units + (
        (max(tally >> 128, id_floor) - (tally >> 128)) << 128
    )
    reward: uint256 = units * rate
    self._credit_reward(pool_id, worker, reward)
    log WorkCredited(
        pool_id=pool_id, worker=worker, batch_id=batch_id, items=items, units=units, reward=reward
    )


@internal
def _credit_reward(pool_id: uint256, worker: address, reward: uint256):
    """Add `reward` to the bucket of this block's epoch. Every bucket that is
    neither empty nor of this epoch nor matured holds the previous epoch (a
    credit two epochs back has matured), so one of the two is always free
    once matured ones are moved to `claimable`."""
    if reward == 0:
        return
    if CHALLENGE_BLOCKS == 0:
        self._claimable[pool_id][worker] += reward
        return
    assert reward <= LOW192, "reward overflow"
    epoch: uint256 = block.number // CHALLENGE_BLOCKS
    free: uint256 = 2
    for i: uint256 in range(2):
        b: uint256 = self._buckets[pool_id][worker][i]
        if b & LOW192 == 0:
            free = i
        elif b >> 192 == epoch:
            assert (b & LOW192) + reward <= LOW192, "reward overflow"
            self._buckets[pool_id][worker][i] = b + reward
            return
        elif self._is_mature(b):
            # Emptied as it is moved: the loop may return on the other bucket,
            # and a matured amount left here would be moved (paid) again.
            self._claimable[pool_id][worker] += b & LOW192
            self._buckets[pool_id][worker][i] = 0
            free = i
    assert free < 2, "no free reward bucket"
    self._buckets[pool_id][worker][free] = (epoch << 192) | reward


@view
@internal
def _is_mature(bucket: uint256) -> bool:
    # Matures at the start of the epoch after next: later than any dispute.
    return CHALLENGE_BLOCKS == 0 or block.number >= ((bucket >> 192) + 2) * CHALLENGE_BLOCKS


@internal
def _take_stake(
    pool_id: uint256, worker: address, work_id: uint256, amount: uint256, reason: String[64]
) -> uint256:
    stake: uint256 = self.stake_of[pool_id][worker]
    assert amount <= stake, "slash exceeds stake"
    assert amount * BPS <= stake * SLASH_BPS, "slash above SLASH_BPS of stake"
    share: uint256 = amount * self._pools[pool_id].reporter_bps // BPS
    rest: uint256 = amount - share
    burnt: uint256 = 0
    self.stake_of[pool_id][worker] = stake - amount
    if self._pools[pool_id].burn_slashed:
        burnt = rest
        self.burnt[pool_id] += rest
    else:
        self._pools[pool_id].funds += rest
    log WorkerSlashed(
        pool_id=pool_id,
        worker=worker,
        work_id=work_id,
        validator=msg.sender,
        amount=amount,
        reporter_share=share,
        burnt=burnt,
        reason=reason,
    )
    if share > 0:
        # State is settled, and every caller holds the lock.
        raw_call(msg.sender, b"", value=share)
    return amount


@pure
@internal
def _hash_pair(a: bytes32, b: bytes32) -> bytes32:
    # Sorted, so a proof needs no left/right flags.
    if convert(a, uint256) < convert(b, uint256):
        return keccak256(concat(a, b))
    return keccak256(concat(b, a))


@pure
@internal
def _verify(leaf: bytes32, proof: DynArray[bytes32, MAX_PROOF], committed: uint256) -> bool:
    node: bytes32 = leaf
    for sibling: bytes32 in proof:
        node = self._hash_pair(node, sibling)
    return convert(node, uint256) & ~LOW64 == committed & ~LOW64


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
