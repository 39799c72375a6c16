"""`make bench-ledger`: the ledger's state machine over many random transactions."""
