"""The one place that knows how to reach the event loop from another thread.

anyio gives blocking round trips (``from_thread.run``); the bus needs the cheaper
fire-and-forget call that asyncio and trio both have (``call_soon_threadsafe`` and
``TrioToken.run_sync_soon``), so that a burst of events wakes the loop once.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LoopHandle", "no_running_loop"]


class LoopHandle:
    """The running event loop, callable from any thread. Create it on the loop."""

    __slots__ = ("backend", "call_soon", "thread_id")

    def __init__(self) -> None:
        self.thread_id = threading.get_ident()
        found = _current_loop()
        if found is None:
            raise RuntimeError("LoopHandle() must be created on a running asyncio or trio loop")
        self.backend, self.call_soon = found

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return threading.get_ident() == self.thread_id


def _current_loop() -> tuple[str, Callable[..., Any]] | None:
    try:
        return "asyncio", asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            return "trio", trio.lowlevel.current_trio_token().run_sync_soon
        except RuntimeError:
            pass
    return None


def no_running_loop() -> bool:
    """Whether the calling thread runs no asyncio or trio event loop."""
    return _current_loop() is None
