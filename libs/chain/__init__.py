"""Chain access for Prime Swarm: the SwarmLedger contract over JSON-RPC (web3.py).

Modules, one job each:
  client      LedgerClient: typed calls, transactions and event reads for a deployed ledger
  deploy      deploy_ledger(): put the committed artifact on a chain
  deployment  the deployment record JSON (address, chain id, RPC URL)
  transactions signing, nonces, receipts, revert reasons -> ChainError
  models      Pool, Work, AttestResult, ... and work-key helpers
  artifacts   load protocol/contracts/build/<Name>.json;  compile: regenerate it with vyper
  keyfile     load_or_create_key(): a worker's or operator's key file
  anvil       start/stop a local anvil dev chain; its dev accounts
  units       amounts: wei as ETH for people, '0.5ether' as wei for commands

The operator's command line over these, `prime-chain`, is services/chain/cli.py.

Importing this package imports nothing heavy; import the module you need.
"""
