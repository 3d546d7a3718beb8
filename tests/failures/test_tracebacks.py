"""Issue 12, observation 10: a user's error in a handler is raised from ``fit()`` with a
traceback that reaches the user's frame without passing through the bus's own frames (the
lane thread, the dispatcher, the producer): below the frames ``fit()`` adds as it re-raises,
it starts at the handler."""

from __future__ import annotations

import traceback
from typing import Any

import anyio
import pytest

from tests.helpers import make_trainer
from trainbus import Callback, blocking


class PlainBoom(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        raise ValueError("plain")


class AsyncBoom(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0)  # suspends: the dispatcher drives the rest of it
        raise ValueError("async")


class EagerAsyncBoom(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        raise ValueError("eager")


class BlockingBoom(Callback):
    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        raise ValueError("blocking")


@pytest.mark.parametrize("callback", [PlainBoom, AsyncBoom, EagerAsyncBoom, BlockingBoom])
def test_the_traceback_of_a_handler_error_skips_the_bus(callback: type[Callback]) -> None:
    with pytest.raises(ValueError) as info:
        make_trainer(2, callbacks=[callback()]).fit_sync()
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename == __file__ and frames[-1].name in {"batch_end", "after_backward"}
    # The engine's own frames are where fit() re-raises; none of the bus's machinery shows.
    inside = [
        f"{f.filename}:{f.name}"
        for f in frames
        if "/trainbus/bus/" in f.filename and not f.filename.endswith("/bus/engine.py")
    ]
    assert not inside, inside
