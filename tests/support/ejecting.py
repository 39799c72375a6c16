"""The variables of an orchestrator that ejects silent workers: the pool owner's key (anvil's
first dev account, the owner `start_live_pool` creates pools with) written as a key file."""

from __future__ import annotations

import json
from pathlib import Path

from prime_swarm.libs.chain.anvil import Anvil


def ejecting_env(anvil: Anvil, tmp_path: Path, eject_after_s: float) -> dict[str, str]:
    key_file = tmp_path / "owner-key.json"
    owner = anvil.dev_accounts(1)[0]
    key_file.write_text(json.dumps({"private_key": owner.key.to_0x_hex()}))
    key_file.chmod(0o600)
    return {
        "PRIME_ORCH_OWNER_KEY_FILE": str(key_file),
        "PRIME_ORCH_EJECT_AFTER_S": str(eject_after_s),
        "PRIME_ORCH_STANDING_CACHE_S": "0.1",
    }
