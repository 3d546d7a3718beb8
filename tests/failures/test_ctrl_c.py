"""Issue 12, observation 2: Ctrl-C, once and twice, under asyncio and trio, and the CLI.

Real subprocesses receive real SIGINTs, sent on cue from their progress lines. The
contract: the first Ctrl-C stops training at the next event and prints one line,
``trainbus: interrupted ...``, saying what it waits for and that a second Ctrl-C
abandons it; every callback is closed (within ``close_timeout``); ``fit_sync()`` then
raises a plain ``KeyboardInterrupt`` (no exception group; the CLI exits with 130). The
second Ctrl-C gives what still runs 2 s more, abandons what is stuck after them, and closes
the rest under the same short deadline (a close still writing its file finishes).
Never a hang; every point logged before the interrupt is in the JSON-lines file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.failures._child import Child
from tests.failures._harness import BOUND, jsonl_points

SCRIPT = Path(__file__).parent / "scripts" / "interrupt_fit.py"
BACKENDS = ["asyncio", "trio"]
RAISED = re.compile(r"raised (\w+) probes=(\d+)")


def interrupted_lines(child: Child) -> list[str]:
    return [line for line in child.err if line.startswith("trainbus: interrupted")]


def check_interrupted_run(
    child: Child, status: int, elapsed: float, out: Path, problems: list[str]
) -> None:
    """What every interrupted run must show (status, bound, stderr, the file); every
    problem is reported at once, so a failure says all that went wrong."""
    if status != 130:
        problems.append(f"exit status {status}, expected 130")
    if elapsed >= BOUND:  # a safety bound only
        problems.append(f"took {elapsed:.1f} s (killed: a hang)")
    raised = [m for m in map(RAISED.search, child.out) if m]
    if not raised or raised[-1][1] != "KeyboardInterrupt":
        problems.append("fit_sync() did not raise a plain KeyboardInterrupt")
    err = "\n".join(child.err)
    if "ExceptionGroup" in err:
        problems.append("a nested exception group reached the user")
    lines = interrupted_lines(child)
    if len(lines) != 1:
        problems.append(f"{len(lines)} 'trainbus: interrupted' lines on stderr, expected 1")
    elif "Ctrl-C" not in lines[0]:
        problems.append(f"the interrupted line does not mention a second Ctrl-C: {lines[0]!r}")
    logged = [int(line.split()[1]) for line in child.out if line.startswith("logged ")]
    probes = int(raised[-1][2]) if raised else max(logged, default=0)
    if not probes:
        problems.append("nothing was logged before the interrupt")
    try:
        steps = sorted(jsonl_points(out))
    except AssertionError as exc:
        problems.append(str(exc))
    else:
        if steps != list(range(1, probes + 1)):
            problems.append(f"JSON-lines file holds {len(steps)} of {probes} logged points")
    assert not problems, "\n".join(problems) + f"\n{child}"


Cue = tuple[str, Callable[[str], bool]] | None


def line_is(text: str) -> Callable[[str], bool]:
    return lambda line: line == text


def press_ctrl_c(tmp_path: Path, args: list[str], cues: list[Cue]) -> tuple[Child, int, float]:
    """Run the script with ``args``; at each cue (a line on "out" or "err"; ``None``: at
    once) press Ctrl-C; return the child, its exit status and the seconds it took."""
    child = Child([str(SCRIPT), "--out", str(tmp_path / "m.jsonl"), *args], tmp_path)
    try:
        for cue in cues:
            if cue is not None:
                child.wait_for(*cue)
            child.interrupt()
        status, elapsed = child.finish(BOUND)
    finally:
        child.kill()
    return child, status, elapsed


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_ctrl_c_stops_closes_and_raises_keyboard_interrupt(
    backend: str, tmp_path: Path
) -> None:
    run = press_ctrl_c(tmp_path, ["--backend", backend], [("out", line_is("logged 5"))])
    check_interrupted_run(*run, tmp_path / "m.jsonl", [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_ctrl_c_with_a_stuck_handler_says_what_it_waits_for_then_abandons_it(
    backend: str, tmp_path: Path
) -> None:
    args = ["--backend", backend, "--stuck", "--close-timeout", "2"]
    child, status, elapsed = press_ctrl_c(tmp_path, args, [("out", line_is("stuck"))])
    problems: list[str] = []
    lines = interrupted_lines(child)
    if lines and "StuckBatchEnd" not in lines[0]:
        problems.append(f"the interrupted line does not name what it waits for: {lines[0]!r}")
    if "CallbackTimeoutWarning" not in "\n".join(child.err):
        problems.append("no CallbackTimeoutWarning for the abandoned StuckBatchEnd")
    check_interrupted_run(child, status, elapsed, tmp_path / "m.jsonl", problems)


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_ctrl_c_abandons_a_stuck_handler_after_its_short_deadline(
    backend: str, tmp_path: Path
) -> None:
    # --close-timeout 3600: only the second Ctrl-C can end the wait
    args = ["--backend", backend, "--stuck", "--close-timeout", "3600"]
    interrupted = ("err", lambda line: line.startswith("trainbus: interrupted"))
    run = press_ctrl_c(tmp_path, args, [("out", line_is("stuck")), interrupted])
    check_interrupted_run(*run, tmp_path / "m.jsonl", [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_ctrl_c_lets_a_close_that_is_still_writing_finish(
    backend: str, tmp_path: Path
) -> None:
    # The JSON-lines destination holds every point until its close writes them out; the
    # second Ctrl-C comes while that close works. It must get its short deadline, not be
    # abandoned on the spot (which lost every point: the full suite saw it as a race).
    cues: list[Cue] = [("out", line_is("logged 5")), ("out", line_is("closing"))]
    run = press_ctrl_c(tmp_path, ["--backend", backend, "--slow-close"], cues)
    check_interrupted_run(*run, tmp_path / "m.jsonl", [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_quick_ctrl_c_still_close_and_keep_every_point(backend: str, tmp_path: Path) -> None:
    # the second within a second of the first (observed: a hang in _cancel_all_tasks)
    run = press_ctrl_c(tmp_path, ["--backend", backend], [("out", line_is("logged 5")), None])
    check_interrupted_run(*run, tmp_path / "m.jsonl", [])


@pytest.mark.slow  # a real demo run; the Ctrl-C paths themselves stay in the default suite
def test_cli_demo_ctrl_c_exits_130_with_a_complete_metrics_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    child = Child(
        ["-m", "trainbus", "demo", "--epochs", "1000", "--out", str(run),
         "--upload-latency-ms", "20"],
        tmp_path,
    )
    try:
        child.wait_for("out", lambda line: bool(line.strip()))  # the first epoch's progress
        child.interrupt()
        status, elapsed = child.finish(BOUND)
    finally:
        child.kill()
    problems: list[str] = []
    if status != 130:
        problems.append(f"exit status {status}, expected 130")
    if elapsed >= BOUND:  # a safety bound only
        problems.append(f"took {elapsed:.1f} s")
    if len(interrupted_lines(child)) != 1:
        problems.append("expected one 'trainbus: interrupted' line on stderr")
    if "Traceback" in "\n".join(child.err):
        problems.append("the CLI printed a traceback for Ctrl-C")
    assert not problems, "\n".join(problems) + f"\n{child}"
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [int(p["step"]) for p in points if p["name"] == "loss/train"]
    assert steps, "no loss was logged before the interrupt"
    assert sorted(steps) == list(range(1, max(steps) + 1))  # nothing logged was lost
