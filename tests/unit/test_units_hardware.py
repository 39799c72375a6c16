"""Amounts in ETH and the hardware line a contributor sees before staking."""

import pytest

from prime_swarm.libs.chain.units import eth
from prime_swarm.libs.model.hardware import detect


@pytest.mark.parametrize(
    ("wei", "shown"),
    [
        (0, "0 ETH"),
        (10**18, "1 ETH"),
        (15 * 10**17, "1.5 ETH"),
        (21 * 10**12, "0.000021 ETH"),
        (10**16 + 1, "0.01 ETH"),  # below a nano-ether is rounding, not money
        (999, "999 wei"),
        (-(10**18), "-1 ETH"),
    ],
)
def test_eth(wei: int, shown: str) -> None:
    assert eth(wei) == shown


def test_cpu_is_described_with_cores_and_memory() -> None:
    hw = detect("cpu")
    assert hw.kind == "cpu" and "cores" in hw.name and hw.memory_gib > 0
    assert hw.describe().endswith("GiB")


def test_a_missing_cuda_device_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    with pytest.raises(ValueError, match="no CUDA device"):
        detect("cuda:0")
