"""`make bench-chain`: gas the ledger charges, read from receipts on a real anvil.

Deploys SwarmLedger from the committed artifact, opens a pool with one validator and
`--workers` staked workers, and records:

- gas_per_rollout: for batch sizes 1, 16, 64 and 256, the gas of `attest_work` divided by the
  items it attested, items spread round-robin over the workers (a validator's queue mixes them)
  and sent sorted as the client sends them, each worker's work ids consecutive as the
  orchestrator hands them out. Batches run after a warm-up batch per worker, so the figure is
  the steady state: a worker's bitmap word, credit and reward slots already exist (the first
  batch of a worker's life pays about 20k gas more per new slot).
- batch_64_by_workers: the batch-64 figure with its items spread over 1, 4 and 16 workers
  (each worker in a batch costs about 20k gas: its membership, bitmap word, tally and reward
  bucket, and a WorkCredited event);
- one_at_a_time_per_rollout: 64 single-item transactions, the gas per item (the "attest one
  at a time" baseline batching is compared against), and `batching_saving` = batch-64 gas per
  rollout / one-at-a-time gas per rollout;
- gas: one join, leave, withdraw, eject, slash, dispute and claim_rewards.

`reference_per_rollout_before` is the figure of the previous ledger (a storage slot per work
key, about 33k gas a rollout in a batch of 32), measured in the issue that asked for this.

    python -m bench.chain [--workers 4]

Writes bench/results/chain.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
from pathlib import Path

from prime_swarm.libs.chain import merkle
from prime_swarm.libs.chain.anvil import Anvil
from prime_swarm.libs.chain.client import LedgerClient
from prime_swarm.libs.chain.deploy import deploy_ledger
from prime_swarm.libs.chain.deployment import DEFAULT_CHALLENGE_BLOCKS, DEFAULT_UNBONDING_BLOCKS
from prime_swarm.libs.chain.models import Work

RESULTS = Path(__file__).resolve().parents[1] / "results" / "chain.json"
ETH = 10**18
BATCH_SIZES = (1, 16, 64, 256)
# The default windows: a worker's reward bucket is opened once per challenge epoch (6 h of
# 12 s blocks), so batches in the middle of an epoch are the steady state measured here.
UNBONDING = DEFAULT_UNBONDING_BLOCKS
CHALLENGE = DEFAULT_CHALLENGE_BLOCKS
# Windows of the second ledger, where unbonding and rewards must end within the bench.
LIFECYCLE_BLOCKS = 10


class Pool:
    """A fresh ledger with one pool, its validator and `n_workers` staked workers, each
    numbering its work ids from 0 as the orchestrator does."""

    def __init__(self, node: Anvil, n_workers: int, unbonding: int, challenge: int) -> None:
        self.node = node
        accounts = node.dev_accounts(n_workers + 2)
        deployment = deploy_ledger(
            node.rpc_url, accounts[0], unbonding_blocks=unbonding, challenge_blocks=challenge
        )
        clients = [LedgerClient.from_deployment(deployment, a, timeout=60) for a in accounts]
        self.owner, self.validator, self.workers = clients[0], clients[1], clients[2:]
        self.id = self.owner.create_pool(
            "http://orchestrator.bench", ETH, 10**12, accounts[0].address
        )
        self.owner.register_validator(self.id, accounts[1].address)
        self.join_gas = [w.join(self.id, ETH).gas_used for w in self.workers]
        self.owner.fund_pool(self.id, 10 * ETH)
        self.addresses = [a.address for a in accounts[2:]]
        self.next_id = dict.fromkeys(self.addresses, 0)

    def items(self, n: int, spread: int) -> list[Work]:
        """`n` items round-robin over the first `spread` workers."""
        out = []
        for worker in itertools.islice(itertools.cycle(self.addresses[:spread]), n):
            out.append(Work(worker, self.next_id[worker], 8))
            self.next_id[worker] += 1
        return out

    def attest_gas(self, n: int, spread: int) -> int:
        res = self.validator.attest_work(self.id, self.items(n, spread))
        assert len(res.attested) == n and len(res.txs) == 1, res
        return res.gas_used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="Staked workers the batches mix.")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    spread = (1, 4, 16)

    with Anvil(accounts=max(args.workers, *spread) + 2) as node:
        # Steady state on the default windows.
        p = Pool(node, max(args.workers, *spread), UNBONDING, CHALLENGE)
        p.attest_gas(len(p.addresses), len(p.addresses))  # warm-up: every worker's slots exist
        per_rollout = {str(n): round(p.attest_gas(n, args.workers) / n, 1) for n in BATCH_SIZES}
        by_workers = {str(k): round(p.attest_gas(64, k) / 64, 1) for k in spread}
        singles = [p.attest_gas(1, args.workers) for _ in range(64)]
        one_at_a_time = round(sum(singles) / len(singles), 1)

    with Anvil(accounts=6) as node:
        # Every other function, on a ledger with short windows so that they can end.
        p = Pool(node, 4, unbonding=LIFECYCLE_BLOCKS, challenge=LIFECYCLE_BLOCKS)
        gas = {"join": p.join_gas[0]}
        p.validator.attest_work(p.id, p.items(4, 4))  # the claimant's reward, maturing below
        # A batch to dispute: its proof from the calldata, as an auditor would rebuild it.
        batch = p.validator.attest_work(p.id, p.items(16, 4)).batches[0]
        items = p.validator.batch_items(p.id, batch.batch_id)
        proof = merkle.proof(p.id, items, 3)
        gas["dispute"] = p.validator.dispute(
            p.id, batch.batch_id, items[3], proof, "bench dispute"
        ).tx.gas_used
        victim = p.addresses[1]
        gas["slash"] = p.validator.slash(p.id, victim, p.next_id[victim], "bench").tx.gas_used
        gas["eject"] = p.owner.eject(p.id, p.addresses[2], "bench eject").tx.gas_used
        gas["leave"] = p.workers[0].leave(p.id).tx.gas_used
        node_w3 = p.owner.w3
        node_w3.provider.make_request("anvil_mine", [hex(3 * LIFECYCLE_BLOCKS)])  # type: ignore[arg-type]
        gas["withdraw"] = _gas_of_last(p.workers[0], lambda: p.workers[0].withdraw(p.id))
        gas["claim"] = _gas_of_last(p.workers[3], lambda: p.workers[3].claim_rewards(p.id))
        gas["attest_batch_64"] = int(per_rollout["64"] * 64)

    result = {
        "gas_per_rollout": per_rollout,
        "batch_64_by_workers": by_workers,
        "one_at_a_time_per_rollout": one_at_a_time,
        "batching_saving": round(per_rollout["64"] / one_at_a_time, 4),
        "gas": gas,
        "reference_per_rollout_before": 33_000,
        "config": {
            "workers": args.workers,
            "units_per_item": 8,
            "unbonding_blocks": UNBONDING,
            "challenge_blocks": CHALLENGE,
            "machine": f"{platform.machine()}, anvil (cancun)",
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _gas_of_last(client: LedgerClient, act: object) -> int:
    """Gas of the transaction `act` sends (calls that return an amount, not a receipt)."""
    act()  # type: ignore[operator]
    block = client.w3.eth.get_block("latest", full_transactions=False)
    receipt = client.w3.eth.get_transaction_receipt(block["transactions"][-1])
    return int(receipt["gasUsed"])


if __name__ == "__main__":
    main()
