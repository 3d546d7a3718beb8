"""The thread boundary (issue 29): one module crosses it, and what it offers works.

``core/bridge.py`` is the only module of trainbus that reaches an event loop from another
thread (or starts one on a thread of its own): the loggers' inbox, the checkpoint uploader
and the dashboard go through it. The first test reads every module with :mod:`ast` and
fails on a loop-crossing call anywhere else. ``serve/`` is the user's server process:
uvicorn runs its own loop there (``create_server(...).run()``, ``await server.serve()``),
which is uvicorn's code, not a crossing of ours.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import anyio
import pytest

import trainbus
from trainbus.core.bridge import LoopHandle, LoopThread
from trainbus.loggers._inbox import Inbox

PACKAGE_DIR = Path(trainbus.__file__).parent
BRIDGE = PACKAGE_DIR / "core" / "bridge.py"

#: Methods and functions that cross into a loop from a thread, start a loop on a thread,
#: or ask which loop runs: whatever object they are called on.
CROSSING_ATTRIBUTES = {
    "call_soon_threadsafe",  # asyncio
    "run_coroutine_threadsafe",
    "new_event_loop",
    "get_event_loop",
    "get_running_loop",
    "run_until_complete",
    "run_forever",
    "current_trio_token",  # trio
    "run_sync_soon",
    "in_trio_run",
    "BlockingPortal",  # anyio.from_thread
    "start_blocking_portal",
}
#: ``module.name`` calls that are crossings only on that module (``anyio.run`` runs a loop
#: on the calling thread, as ``fit_sync`` does: no crossing, so it is allowed).
CROSSING_QUALIFIED = {("asyncio", "run"), ("anyio", "from_thread"), ("trio", "from_thread")}
#: What may not be imported by name, per module.
CROSSING_IMPORTS = {
    "asyncio": CROSSING_ATTRIBUTES | {"run"},
    "trio": CROSSING_ATTRIBUTES | {"from_thread"},
    "trio.lowlevel": CROSSING_ATTRIBUTES,
    "anyio": CROSSING_ATTRIBUTES | {"from_thread"},
}


def crossings(text: str, where: str) -> list[str]:
    """``"where:line: what"`` for each loop-crossing use in the module source ``text``."""
    found = []
    for node in ast.walk(ast.parse(text, filename=where)):
        what = None
        if isinstance(node, ast.Attribute):
            if node.attr in CROSSING_ATTRIBUTES:
                what = node.attr
            elif isinstance(node.value, ast.Name) and (node.value.id, node.attr) in (
                CROSSING_QUALIFIED
            ):
                what = f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = {alias.name for alias in node.names}
            if node.module in ("anyio.from_thread", "trio.from_thread"):
                bad = names
            else:
                bad = names & CROSSING_IMPORTS.get(node.module, set())
            if bad:
                what = f"from {node.module} import {', '.join(sorted(bad))}"
        elif isinstance(node, ast.Import) and any(
            alias.name.endswith(".from_thread") for alias in node.names
        ):
            what = "import ...from_thread"
        if what is not None:
            found.append(f"{where}:{node.lineno}: {what}")
    return found


def test_only_the_bridge_crosses_between_a_thread_and_an_event_loop() -> None:
    found = [
        hit
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if path != BRIDGE
        for hit in crossings(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE_DIR.parent))
        )
    ]
    assert not found, (
        "loop-crossing calls outside trainbus/core/bridge.py (use bridge.LoopHandle, "
        "LoopThread or no_running_loop):\n" + "\n".join(found)
    )


def test_the_check_finds_each_form_of_crossing() -> None:
    """The check above sees each form (it cannot pass by reading nothing)."""
    text = (
        "import asyncio\nfrom asyncio import run\nimport anyio.from_thread\n"
        "from trio.lowlevel import current_trio_token\n"
        "loop = asyncio.new_event_loop()\nloop.call_soon_threadsafe(print)\n"
        "asyncio.run(main())\nanyio.from_thread.run(f)\n"
    )
    assert [hit.split(": ", 1)[1] for hit in crossings(text, "probe.py")] == [
        "from asyncio import run", "import ...from_thread",
        "from trio.lowlevel import current_trio_token", "new_event_loop",
        "call_soon_threadsafe", "asyncio.run", "anyio.from_thread",
    ]  # fmt: skip
    assert crossings(BRIDGE.read_text(encoding="utf-8"), "bridge.py")  # the bridge does


# -- what the bridge offers --------------------------------------------------------------


@pytest.mark.anyio
async def test_a_loop_handle_names_its_backend_and_calls_from_another_thread(
    anyio_backend: str,
) -> None:
    loop = LoopHandle()
    assert loop.backend == anyio_backend
    assert loop.thread_id == threading.get_ident()
    called = anyio.Event()
    seen: list[int] = []

    def on_loop(n: int) -> None:
        seen.append(threading.get_ident())
        called.set()

    threading.Thread(target=loop.call_soon, args=(on_loop, 1)).start()
    with anyio.fail_after(10):
        await called.wait()
    assert seen == [loop.thread_id]


def test_a_loop_handle_needs_a_loop() -> None:
    with pytest.raises(RuntimeError, match="must be created on a running asyncio or trio"):
        LoopHandle()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_loop_thread_runs_the_backend_it_is_given(backend: str) -> None:
    thread = LoopThread("test-bridge-loop", backend=backend)
    try:
        assert thread.loop is not None and thread.loop.backend == backend

        async def backend_of_loop() -> str:
            return LoopHandle().backend

        assert thread.call(backend_of_loop) == backend
    finally:
        thread.stop(timeout=10)
    assert not thread.is_alive()


def test_a_loop_threads_main_task_ends_the_thread_when_it_returns() -> None:
    thread = LoopThread("test-bridge-main")
    release, running = threading.Event(), threading.Event()

    async def main() -> None:
        running.set()
        while not release.is_set():
            await anyio.sleep(0.01)

    thread.start_main(main)
    assert running.wait(10)
    assert thread.is_alive()
    release.set()
    thread.stop(timeout=10)  # returns as soon as main does; also without the stop
    assert not thread.is_alive()


def test_stop_waits_at_most_its_timeout_for_a_task_that_does_not_end() -> None:
    thread = LoopThread("test-bridge-stuck")
    stop = threading.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            await anyio.sleep(0.01)

    thread.start_soon(stubborn)
    thread.stop(timeout=0.2)
    assert thread.is_alive()  # still running its task: stop gave up waiting
    stop.set()
    thread.stop(timeout=10)
    assert not thread.is_alive()


@pytest.mark.anyio
async def test_the_inbox_wakes_the_loop_once_per_batch_from_a_thread() -> None:
    inbox = Inbox(batch_size=10)
    wakeups: list[int] = []
    inbox.attach(lambda: wakeups.append(threading.get_ident()))

    def lane() -> None:
        for _ in range(25):
            inbox.put([1, 2], params=False)  # 50 items: a wake-up per 10
        inbox.put([{"lr": 0.1}], params=True)  # hyperparameters: at once

    await anyio.to_thread.run_sync(lane)
    after = anyio.Event()  # the loop runs its calls in order: this one comes after them
    await anyio.to_thread.run_sync(LoopHandle().call_soon, after.set)
    with anyio.fail_after(10):
        await after.wait()
    assert wakeups == [threading.get_ident()] * 6  # on the loop: 5 batches, then params
    assert sum(len(items) for items, _ in inbox.take()) == 51
    assert inbox.pending == 0
    inbox.detach()
    inbox.put([1] * 20, params=False)  # no loop: waits for the next take, wakes nobody
    assert len(wakeups) == 6 and inbox.pending == 20
