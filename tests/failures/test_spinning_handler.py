"""An ``async def`` handler that never awaits ends, or is named, within its deadline (issue 45).

``while True: pass`` in an ``async def batch_end`` or ``close`` holds the event loop's
thread, so the loop's own deadlines (``wait_warning`` at the barrier, ``close_timeout`` in
close, both 5 s in ``scripts/spinning_handler.py``) never fire: the run hung for ever.
Now a watch outside the loop (``bus/watchdog.py``) names the handler on stderr once the
deadline passes. Only a deadline the user set ends a handler's wait (issue 55; SPEC D7):
under ``fit_sync()``, past ``close_timeout`` in close, it raises ``HandlerInterrupted``
inside it and the close goes on without it; past ``wait_warning`` at a barrier (a warning's
threshold) it names the handler and the run waits for it. Under ``anyio.run(trainer.fit)``
(the user's loop) it is only named. A child still waiting is killed.

Real processes: each waits for the child's ``spinning`` cue, then at most the deadline
plus ``SLACK`` seconds for the outcome (a bound on a hang, not a timing claim).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.failures._child import Child

SCRIPT = Path(__file__).parent / "scripts" / "spinning_handler.py"
DEADLINE = 5.0
SLACK = 10.0  # the watch's confirmation (1 s) and a loaded 2-core machine
EVENT = {"batch_end": "Event.BATCH_END", "close": "close"}


@pytest.mark.slow
def test_under_fit_sync_a_handler_spinning_past_wait_warning_is_named_not_interrupted(
    tmp_path: Path,
) -> None:
    child = Child([str(SCRIPT), "batch_end", "fit_sync"], cwd=tmp_path)
    try:
        child.wait_for("out", lambda line: line == "spinning")
        named = child.wait_for("err", lambda line: "held the event loop" in line,
                               DEADLINE + SLACK)  # fmt: skip
        assert "Spins.batch_end" in named and EVENT["batch_end"] in named
        assert "the run waits for it (wait_warning only warns" in named
        assert "raising HandlerInterrupted" not in named
        assert child.proc.poll() is None  # still waiting: nothing ended the handler
    finally:
        child.kill()
        child.close()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["close"])
def test_under_fit_sync_the_spinning_handler_is_interrupted_and_fit_raises(
    tmp_path: Path, where: str
) -> None:
    child = Child([str(SCRIPT), where, "fit_sync"], cwd=tmp_path)
    try:
        child.wait_for("out", lambda line: line == "spinning")
        named = child.wait_for("err", lambda line: "held the event loop" in line,
                               DEADLINE + SLACK)  # fmt: skip
        assert f"Spins.{where}" in named and "raising HandlerInterrupted" in named
        child.wait_for("out", lambda line: line.startswith("fit "), SLACK)
        assert child.proc.wait(SLACK) == 0
    finally:
        child.kill()
        child.close()
    out = "\n".join(child.out)
    assert "fit raised HandlerInterrupted" in out, child
    assert f"raised by Spins.{where}" in out  # the bus's note: the handler (and event)
    if where == "batch_end":
        assert EVENT[where] in out


@pytest.mark.slow
@pytest.mark.parametrize("where", ["batch_end", "close"])
def test_in_the_users_loop_the_spinning_handler_is_named_on_stderr(
    tmp_path: Path, where: str
) -> None:
    child = Child([str(SCRIPT), where, "anyio.run"], cwd=tmp_path)
    try:
        child.wait_for("out", lambda line: line == "spinning")
        named = child.wait_for("err", lambda line: "held the event loop" in line,
                               DEADLINE + SLACK)  # fmt: skip
    finally:
        child.kill()
        child.close()
    assert f"Spins.{where}" in named
    assert "cannot be interrupted in your own event loop" in named
    assert (EVENT[where] if where == "batch_end" else "close deadline") in named
