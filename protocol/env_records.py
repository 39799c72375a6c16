"""What validators keep in Redis about each environment, shared among them (their `validator:*`
prefix; libs/rollout/env_disputes.py reads it): evidence from beyond one validator's machine of
whether an environment's tokens replay on every machine.

- `ENV_GROUPS`: worker -> groups of the environment its validators judged.
- `ENV_MISMATCHES`: worker -> those whose environment tokens, reward or end did not replay
  while the environment agreed with itself on the validator's machine.

`{env}` is `env_key(name, args_key)`: an environment with other arguments is another one.
"""

import hashlib

ENV_GROUPS = "validator:env:{env}:groups"
ENV_MISMATCHES = "validator:env:{env}:mismatches"


def env_key(name: str, args_key: str) -> str:
    return f"{name}:{hashlib.sha256(args_key.encode()).hexdigest()[:12]}"
