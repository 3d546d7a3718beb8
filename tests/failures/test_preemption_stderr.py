"""A SIGTERM stop that went as designed prints what it did, not a traceback (issue 45, item 8).

With a plain handler stuck at ``BATCH_END``, preemption's watchdog writes the checkpoint and
abandons the handler (``Engine._abandon``, which cuts every bounded wait on the loop). That
call ran on the loop outside any task, where ``anyio.current_time()`` raised
``NoEventLoopError``: exit 143 and the checkpoint were right, but stderr ended with a
traceback. Now stderr holds only trainbus's lines and the abandoned callback's warning.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.failures._child import Child
from trainbus.core.bridge import LoopHandle

SCRIPT = Path(__file__).parent / "scripts" / "preempt_stuck.py"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_loops_clock_can_be_read_in_a_call_soon_callback(backend: str) -> None:
    """What ``Session.abandon`` needs where it runs: outside any task, on the loop."""

    async def main() -> tuple[float, float]:
        handle = LoopHandle()
        got = anyio.Event()
        box: list[float] = []
        handle.call_soon(lambda: (box.append(handle.current_time()), got.set()))
        await got.wait()
        return box[0], anyio.current_time()

    in_callback, after = anyio.run(main, backend=backend)
    assert in_callback <= after  # the same clock the cancel scopes' deadlines are on


@pytest.mark.slow
def test_sigterm_with_a_stuck_plain_handler_prints_what_it_did_and_no_traceback(
    tmp_path: Path,
) -> None:
    child = Child(
        [str(SCRIPT), str(tmp_path), "--stuck", "plain", "--runner", "fit_sync",
         "--grace", "15"],
        cwd=tmp_path,
    )  # fmt: skip
    try:
        child.wait_for("out", lambda line: line == "stuck")
        child.proc.send_signal(signal.SIGTERM)
        try:
            status = child.proc.wait(60)
        except subprocess.TimeoutExpired:
            status = None
    finally:
        child.kill()
        child.close()
    assert status == 143, child
    assert (tmp_path / "ckpt" / "ba5.pt").is_file()
    err = "\n".join(child.err)
    assert "Traceback" not in err and "NoEventLoopError" not in err, err
    assert "trainbus: SIGTERM: checkpoint written to" in err
    assert "within 2.0 s of SIGTERM's forced stop and was abandoned" in err
