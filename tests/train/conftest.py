"""Fixtures of the training tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Multi-threaded CPU kernels are not bitwise reproducible run to run (torchrun sets 1 thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
