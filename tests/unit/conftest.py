"""Fixtures shared by unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def inference() -> Iterator[None]:
    """Run a test without autograd, as workers and validators do: a loaded policy's parameters
    still require grad, and tests call the model directly."""
    with torch.no_grad():
        yield
