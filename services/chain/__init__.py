"""`prime-chain`, the ledger operator's command line: a thin shell over `libs/chain`."""
