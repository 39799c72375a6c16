"""Amounts for people: wei as ETH, the unit every wallet and faucet speaks."""

from __future__ import annotations

from decimal import Decimal

WEI_PER_ETH = 10**18


def eth(wei: int) -> str:
    """'1.5 ETH', '0.000021 ETH'; amounts below a nano-ether stay exact, in wei."""
    if wei == 0:
        return "0 ETH"
    if abs(wei) < 10**9:
        return f"{wei} wei"
    value = (Decimal(wei) / WEI_PER_ETH).quantize(Decimal("1e-9")).normalize()
    return f"{value:f} ETH"
