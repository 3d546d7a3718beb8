"""A preemption notice in every phase, in one process and under torchrun (issue 53, items 1, 7).

``tests/distributed_scripts/preempt_phases.py`` holds a chosen phase on one rank until its
notice comes (before the first batch, during the first batch, during evaluation, while a
checkpoint is being written, during close) or sticks a plain ``batch_end`` handler for an hour.
The test waits for the file the child writes when it reached the phase, sends ``SIGTERM`` (to
torchrun, or to one rank's pid), and checks the stop by what the processes leave behind:
every rank's status 143, the newest completed batch's checkpoint (none when no batch was
trained), the stop report of ``TRAINBUS_STOP_REPORT``, and that the last bound
(``os._exit`` one second before the deadline) never had to end a rank, so the stop finished
within ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT=8``. The stuck cases relaunch from the checkpoint: the
JSON-lines file then holds each step once. Each cell prints the seconds from the signal to
the job's exit (``-s``): a record for the closing note, not an assertion.

Real processes for seconds each under a deadline of 8 s: all in the slow suite.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_scripts" / "preempt_phases.py"
GRACE = 8  # TORCH_ELASTIC_SHUTDOWN_TIMEOUT: torchrun's SIGTERM -> SIGKILL, and our deadline
BOUND = 120  # a hung launch fails the test instead of the suite (a safety bound)
LAST_BOUND = "is almost over and fit() has not returned"  # the watchdog's os._exit line
TOTAL = {"one": 32, "torchrun": 32}  # batches of the whole run, a rank's
SUMMARY = r"exitcode\s+:\s*(-?\d+)"  # a rank's status in torchrun's closing summary


def _env(out: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(GRACE)
    env["TRAINBUS_STOP_REPORT"] = str(out / "stop-{rank}.json")
    env.pop("PYTHONWARNINGS", None)
    return env


def _command(mode: str, out: Path, *args: str) -> list[str]:
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return [sys.executable, *(launcher if mode == "torchrun" else []), str(SCRIPT), str(out),
            *args]  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen[Any]) -> None:
    """Wait until the child wrote ``path`` (it reached its phase) or ended."""
    deadline = time.monotonic() + BOUND
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # a file the child writes: nothing to wait on but its existence
    assert path.exists(), f"the child did not reach its phase ({path.name})\n" + _output(path)


def _output(path: Path) -> str:
    out = path.parent
    return "".join(
        (out / name).read_text() for name in ("stdout", "stderr") if (out / name).exists()
    )


def _preempt(
    tmp_path: Path, mode: str, phase: str, rank: int = 0, target: str = "launcher",
    *extra: str,
) -> dict[str, Any]:
    """Run, reach ``phase`` on ``rank``, SIGTERM ``target`` ("launcher", or a rank's number);
    the statuses, the stop batch, the checkpoints, the reports and the seconds it took."""
    out = tmp_path / "run"
    out.mkdir()
    with (out / "stdout").open("w") as stdout, (out / "stderr").open("w") as stderr:
        proc = subprocess.Popen(
            _command(mode, out, "--phase", phase, "--rank", str(rank), *extra), env=_env(out),
            stdout=stdout, stderr=stderr,
        )  # fmt: skip
        try:
            _wait_for(out / f"phase-rank{rank}", proc)
            pid = proc.pid if target == "launcher" else int((out / f"pid-rank{target}").read_text())
            sent, wall = time.monotonic(), time.time()
            os.kill(pid, signal.SIGTERM)
            status = proc.wait(BOUND)
            seconds = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    ranks = (0, 1) if mode == "torchrun" else (0,)
    folder = out / "ckpt"
    result = {
        "out": out,
        "status": status,
        "seconds": seconds,
        "exits": [(out / f"exit-rank{r}").read_text() for r in ranks],
        "done": [int((out / f"done-rank{r}").read_text()) for r in ranks],
        "checkpoints": sorted(
            (int(p.stem.removeprefix("ba")) for p in folder.glob("ba*.pt")), reverse=True
        ),
        "reports": [
            json.loads(p.read_text()) if p.exists() else None
            for p in (out / f"stop-{r}.json" for r in ranks)
        ],
        "output": _output(out / "stdout"),
    }
    # fit_sync() raised on the last rank (its exit file, written then), then the job's exit.
    raised = max((out / f"exit-rank{r}").stat().st_mtime for r in ranks) - wall
    print(f"\n{mode} {phase} (rank {rank}, SIGTERM to {target}): fit_sync() raised after "
          f"{raised:.1f} s, exit after {seconds:.1f} s, stopped after {result['done']}, "
          f"checkpoints {result['checkpoints'][:2]}")  # fmt: skip
    return result


def _check_stop(result: dict[str, Any], mode: str) -> None:
    """Every rank exited 143 within the deadline and says so in its stop report."""
    output = result["output"]
    assert result["exits"] == ["143"] * len(result["exits"]), output
    if mode == "one":
        assert result["status"] == 143, output
    else:  # torchrun's own status is 1 whatever its workers' (docs/preemption.md)
        assert result["status"] == 1, output
    assert LAST_BOUND not in output, output  # no rank needed the last bound
    # torchrun's summary (when a worker's exit ended the job): every rank's real status.
    assert set(re.findall(SUMMARY, output)) <= {"143"}, output
    done = result["done"]
    assert len(set(done)) == 1, output  # every rank stopped after the same batch
    for report, stopped in zip(result["reports"], done, strict=True):
        assert report is not None and report["preempted"] is True, output
        assert report["batch"] == stopped and report["exit_code"] == 143


PHASES = ["fit_start", "batch", "eval", "checkpoint", "close"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one", "torchrun"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_notice_in_every_phase_ends_within_the_deadline_with_the_newest_checkpoint(
    tmp_path: Path, phase: str, mode: str
) -> None:
    result = _preempt(tmp_path, mode, phase)
    _check_stop(result, mode)
    stopped = result["done"][0]
    if phase == "fit_start" and mode == "one":
        # No batch was trained: nothing to save (torchrun: the ranks agree on batch 2).
        assert stopped == 0 and result["checkpoints"] == [], result["output"]
        assert result["reports"][0]["checkpoint"] is None
        return
    if phase == "close":
        assert stopped == TOTAL[mode]  # every batch was trained before the notice
    assert result["checkpoints"][0] == stopped, result["output"]  # the newest: its batch
    assert result["reports"][0]["checkpoint"].endswith(f"ba{stopped}.pt")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stuck", "target", "relaunch"),
    [(0, "launcher", False), (0, "1", True), (1, "launcher", True), (1, "0", False)],
    ids=["stuck-0-sigterm-torchrun", "stuck-0-sigterm-rank-1", "stuck-1-sigterm-torchrun",
         "stuck-1-sigterm-rank-0"],
)  # fmt: skip
def test_a_stuck_handler_under_torchrun_leaves_the_checkpoint_and_a_relaunch_resumes(
    tmp_path: Path, stuck: int, target: str, relaunch: bool
) -> None:
    """The issue's case: a plain ``batch_end`` stuck for an hour at batch 3 on one rank.

    The relaunch (each step once) runs for one checkpoint of each kind (the held batch's,
    the stop batch's): the other two cells leave the same checkpoints, and a launch costs
    tens of seconds on a loaded machine."""
    result = _preempt(tmp_path, "torchrun", "stuck", rank=stuck, target=target)
    _check_stop(result, "torchrun")
    output = result["output"]
    assert "Stuck.batch_end" in output  # the abandoned handler, named
    assert result["done"] == [4, 4]  # the ranks agreed one batch after the stuck one
    # Stuck on rank 0 (the saver's): the batch it was held at, the newest whose events
    # every handler there saw. Stuck on rank 1: rank 0 writes the stop batch's.
    assert result["checkpoints"] == [3 if stuck == 0 else 4], output
    if not relaunch:
        return
    out = result["out"]
    again = subprocess.run(
        _command("torchrun", out, "--load", str(out / "ckpt")), env=_env(out),
        capture_output=True, text=True, timeout=BOUND, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    lines = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if r["name"] == "loss/train"]
    assert steps == list(range(1, TOTAL["torchrun"] + 1)), steps  # every step once


@pytest.mark.slow
def test_every_rank_exits_143_also_the_one_torchrun_signals_as_it_ends(tmp_path: Path) -> None:
    """Item 7: SIGTERM to rank 1 only; rank 0 stops with it and is still running (30 s more)
    when rank 1 has exited and torchrun sends it ``SIGTERM``: it exits with 143 (before: it
    died of the signal, -15), torchrun exits 1, and each rank's report says it was preempted."""
    result = _preempt(tmp_path, "torchrun", "batch", 1, "1", "--linger", "0")
    _check_stop(result, "torchrun")
    codes = re.findall(SUMMARY, result["output"])
    assert codes == ["143", "143"], result["output"]  # both ranks, in torchrun's summary
    assert [r["reason"] for r in result["reports"]] == ["SIGTERM on another rank", "SIGTERM"]
