"""`make bench-chain`: gas per attested rollout and of every other ledger function."""
