"""One torch thread in these tests: on a shared 2-core machine torch's intra-op threads
contend with the bus's and each other (a tiny MLP's step goes from 0.1 ms to 20 ms)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
