# pragma version ~=0.4.3
# pragma evm-version cancun
"""
@title A worker contract that re-enters the ledger when paid
@notice Test fixture for tests/integration/test_chain_ledger.py: on every
        payment it calls back into the ledger once (withdraw or claim,
        whichever `mode` names) and records whether that call succeeded.
"""

interface Ledger:
    def join(pool_id: uint256): payable
    def leave(pool_id: uint256) -> uint256: nonpayable
    def withdraw(pool_id: uint256) -> uint256: nonpayable
    def claim_rewards(pool_id: uint256) -> uint256: nonpayable

MODE_NONE: constant(uint8) = 0
MODE_WITHDRAW: constant(uint8) = 1
MODE_CLAIM: constant(uint8) = 2

ledger: public(Ledger)
pool_id: public(uint256)
mode: public(uint8)
reentered: public(bool)
reentry_succeeded: public(bool)
received: public(uint256)


@deploy
def __init__(ledger: address, pool_id: uint256):
    self.ledger = Ledger(ledger)
    self.pool_id = pool_id


@external
@payable
def join():
    extcall self.ledger.join(self.pool_id, value=msg.value)


@external
def leave():
    extcall self.ledger.leave(self.pool_id)


@external
def withdraw(mode: uint8):
    self.mode = mode
    self.reentered = False
    extcall self.ledger.withdraw(self.pool_id)


@external
def claim(mode: uint8):
    self.mode = mode
    self.reentered = False
    extcall self.ledger.claim_rewards(self.pool_id)


@external
@payable
def __default__():
    self.received += msg.value
    if self.mode == MODE_NONE or self.reentered:
        return
    self.reentered = True
    selector: Bytes[4] = method_id("withdraw(uint256)")
    if self.mode == MODE_CLAIM:
        selector = method_id("claim_rewards(uint256)")
    ok: bool = raw_call(
        self.ledger.address, concat(selector, abi_encode(self.pool_id)), revert_on_failure=False
    )
    self.reentry_succeeded = ok
