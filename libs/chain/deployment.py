"""The deployment record: where a ledger lives; written by `prime-chain deploy`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ChainError
from .files import atomic_write_text

# 10% of a worker's stake per slash: enough to make cheating cost more than it earns on a
# single bad rollout, small enough that one validator error is not ruinous.
DEFAULT_SLASH_BPS = 1_000

# How long (in blocks) a leaving worker's stake stays slashable. A day of Ethereum's 12 s
# blocks: validators slash within minutes of a submission (`attest_interval_s`), so a day covers
# a validator that was down overnight, and ties an honest worker's stake up for no longer than
# that. Counted in blocks, so convert for faster chains (an L2 with 2 s blocks needs 43_200).
# Anvil mines a block per transaction, not per second: there it means 7_200 transactions, and
# tests or local runs that want to withdraw mine blocks (`anvil_mine`) or deploy with fewer.
DEFAULT_UNBONDING_BLOCKS = 7_200

# How long (in blocks) an attestation can be disputed; rewards become claimable after it. A
# quarter of the unbonding period (6 h of 12 s blocks): long enough for a second validator or
# an audit to re-check a batch, short enough that workers are paid the same day. The contract
# requires it to be at most the unbonding period, so a dispute can still reach the stake.
DEFAULT_CHALLENGE_BLOCKS = 1_800


@dataclass(frozen=True)
class Deployment:
    rpc_url: str
    chain_id: int
    address: str
    deployer: str
    block: int
    tx_hash: str
    contract: str
    slash_bps: int
    unbonding_blocks: int
    challenge_blocks: int


def write_deployment(path: str | Path, deployment: Deployment) -> None:
    atomic_write_text(Path(path), json.dumps(asdict(deployment), indent=2) + "\n")


def load_deployment(path: str | Path) -> Deployment:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChainError(f"deployment file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ChainError(f"cannot read deployment file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ChainError(f"deployment file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ChainError(f"deployment file {path} does not hold a JSON object")
    fields = Deployment.__dataclass_fields__
    missing = sorted(set(fields) - set(data))
    if missing:
        raise ChainError(f"deployment file {path} lacks {', '.join(missing)}")
    return Deployment(**{name: data[name] for name in fields})
