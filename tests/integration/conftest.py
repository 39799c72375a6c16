"""Shared fixtures for integration tests: real servers on free 127.0.0.1 ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prime_swarm.libs.chain.anvil import Anvil, AnvilError, find_anvil


@pytest.fixture(scope="session")
def anvil() -> Iterator[Anvil]:
    """A running anvil dev chain for the whole session.

    Yields the `Anvil` handle: `.rpc_url`, `.chain_id` and `.dev_accounts(n)` (funded
    `LocalAccount`s derived from anvil's dev mnemonic). Tests deploy their own ledger on it
    (`libs.chain.deploy.deploy_ledger`) so they never see each other's pools.
    """
    try:
        find_anvil()
    except AnvilError as exc:
        pytest.fail(f"integration tests need anvil: {exc}", pytrace=False)
    with Anvil(accounts=20) as node:
        yield node
