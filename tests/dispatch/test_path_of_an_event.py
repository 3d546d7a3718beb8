"""The path of one event is short enough to read: the modules it passes through.

One ``BATCH_END`` published to a plain handler (on a lane thread) or to an ``async def``
handler that awaits (on the loop), through the barrier and back, with the default
options, once the slow-callback check of the first batches is over, traced with
``sys.setprofile`` on every thread: the trainbus modules whose functions run between the
call to ``publish`` and its return. ``CONTRIBUTING.md`` walks the same path.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import pytest
import torch

import trainbus
from trainbus import Callback, Engine, Event, Logger, State
from trainbus.bus.slow import CHECK_BATCHES

pytestmark = pytest.mark.anyio

PACKAGE = Path(trainbus.__file__).parent
#: producer, queue, worker; core's state (the snapshot) and logger (bound to it)
MAX_MODULES = 5


class Awaits(Callback):
    def __init__(self) -> None:
        self.calls = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self.calls += 1


class Plain(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def batch_end(self, state: Any, logger: Any) -> None:
        self.calls += 1


@pytest.mark.parametrize("kind", [Plain, Awaits], ids=["plain", "async"])
async def test_batch_end_to_a_handler_and_back_passes_few_modules(kind: type) -> None:
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    callback = kind()
    engine = Engine(state, Logger(state), [callback])
    recording = threading.Event()
    modules: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and recording.is_set():
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(PACKAGE):
                modules.add(path.relative_to(PACKAGE).as_posix())

    def produce() -> None:
        publish = engine.publisher()
        # warm: the first event builds what later ones reuse; the first few batches are
        # compared with their handlers' time (bus/slow.py), then no more
        for _ in range(CHECK_BATCHES + 1):
            publish(Event.BATCH_END)
            state.timer.on_batch_complete(samples=1)
        # What the warm-up left for the loop runs first (on a loaded machine the check may
        # find the handler slow, and its warning is reported on the loop, D7): the loop
        # runs call_soon callbacks in order.
        ran = threading.Event()
        session = engine._session
        assert session is not None
        session.loop.call_soon(ran.set)
        ran.wait()
        recording.set()
        try:
            publish(Event.BATCH_END)
        finally:
            recording.clear()

    previous = sys.getprofile()
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        await engine.run_cycle(produce)
    finally:
        sys.setprofile(previous)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert callback.calls == CHECK_BATCHES + 2
    print(sorted(modules))
    assert "bus/worker.py" in modules  # the trace did see the handler's side
    assert len(modules) <= MAX_MODULES, sorted(modules)
