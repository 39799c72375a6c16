"""Amounts for people: wei as ETH, the unit every wallet and faucet speaks, and back."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

WEI_PER_ETH = 10**18
_AMOUNT = re.compile(r"^(\d+(?:\.\d+)?)\s*(wei|gwei|ether|eth)?$", re.IGNORECASE)
_UNIT_WEI = {"wei": 1, "gwei": 10**9, "ether": WEI_PER_ETH, "eth": WEI_PER_ETH}


def parse_wei(text: str) -> int:
    """Wei from '1000', '2gwei' or '0.5ether'; ValueError names what is wrong. Fractions of a
    wei are refused, not rounded: an amount that moves stake or funds is never guessed."""
    match = _AMOUNT.match(text.strip())
    if not match:
        raise ValueError(
            f"invalid amount {text!r} (use wei, or a number with gwei/ether, e.g. 0.5ether)"
        )
    try:
        wei = Decimal(match.group(1)) * _UNIT_WEI[(match.group(2) or "wei").lower()]
    except InvalidOperation:
        raise ValueError(f"invalid amount {text!r}") from None
    if wei != wei.to_integral_value():
        raise ValueError(f"amount {text!r} is not a whole number of wei")
    return int(wei)


def eth(wei: int) -> str:
    """'1.5 ETH', '0.000021 ETH'; amounts below a nano-ether stay exact, in wei."""
    if wei == 0:
        return "0 ETH"
    if abs(wei) < 10**9:
        return f"{wei} wei"
    value = (Decimal(wei) / WEI_PER_ETH).quantize(Decimal("1e-9")).normalize()
    return f"{value:f} ETH"
