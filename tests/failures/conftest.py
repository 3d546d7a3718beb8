"""The failure tests' ``@pytest.mark.slow`` cases (the fault suite's full cross product)
run only when asked for (``-m slow``); the default run deselects them."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr") or ""):
        return  # `-m slow` (or any expression naming it) decides for itself
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (deselected if slow and HERE in item.path.parents else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
