"""SIGTERM is bounded by the grace period even when a handler is stuck (issue 32, item 2).

``tests/failures/scripts/preempt_stuck.py`` trains with ``Preemption(grace=15)`` and
``close_timeout=6``; a callback blocks for 90 s in ``batch_end`` at batch 5 (a plain
``time.sleep``, an ``await anyio.sleep`` or a ``time.sleep`` inside ``async def``, which
blocks the event loop's thread), and SIGTERM comes 0.3 s after it started. Within the
grace period the process must write the checkpoint of batch 5, name the stuck handler on
stderr, close every other callback and exit with 143; the checkpoint then resumes to the
same weights as an uninterrupted run, and the JSON-lines file holds each step once.

Every case runs real processes for about 20 s, so all nine are in the slow suite
(``pytest -m slow``, which CI runs): plain, ``await`` and loop-blocking handlers, each under
``fit_sync()`` and ``anyio.run(trainer.fit)`` on asyncio and trio.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.failures._child import Child, child_env

SCRIPT = Path(__file__).parent / "scripts" / "preempt_stuck.py"
GRACE = 15.0
STUCK = {"plain": "Stuck.batch_end", "async": "AsyncStuck.batch_end",
         "async-sleep": "AsyncStuck.batch_end", "stubborn": "AsyncStuck.batch_end"}  # fmt: skip


def _finish(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(workdir)], env=child_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    workdir = tmp_path_factory.mktemp("reference")
    done = _finish(workdir)
    assert done.returncode == 0, done.stderr
    loaded: dict[str, torch.Tensor] = torch.load(workdir / "final.pt", weights_only=True)
    return loaded


CASES = [
    (stuck, runner)
    for stuck in ("plain", "async", "async-sleep")
    for runner in ("fit_sync", "asyncio", "trio")
]


@pytest.mark.parametrize(
    ("stuck", "runner"), [pytest.param(*c, marks=pytest.mark.slow) for c in CASES]
)
def test_sigterm_with_a_stuck_handler_checkpoints_closes_and_exits_143_within_grace(
    tmp_path: Path, reference: dict[str, torch.Tensor], stuck: str, runner: str
) -> None:
    err = _preempt(tmp_path, stuck, runner)
    for name in ("closed-plain", "closed-async"):  # every other callback closed
        assert (tmp_path / name).read_text() == "5", name
    assert "ignored" not in err
    _check_resume(tmp_path, reference)


@pytest.mark.slow
def test_a_loop_blocked_for_good_still_ends_within_grace_with_its_checkpoint(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    """The last bound: a handler that blocks the loop and ignores ``HandlerAbandoned``. The
    process ends with ``os._exit(143)`` one second before the grace period ends, after the
    checkpoint was written; the callbacks' ``close`` could not run (the loop never came back)."""
    err = _preempt(tmp_path, "stubborn", "fit_sync")
    assert "ignored HandlerAbandoned" in err  # interrupted, and it went on blocking
    assert "exiting with status 143 now" in err
    _check_resume(tmp_path, reference)


def _preempt(tmp_path: Path, stuck: str, runner: str) -> str:
    """Run the child with a stuck handler, SIGTERM it 0.3 s after it blocked; check the
    exit status, the bound, the handler named on stderr and the checkpoint. Its stderr."""
    child = Child(
        [str(SCRIPT), str(tmp_path), "--stuck", stuck, "--runner", runner,
         "--grace", str(GRACE)],
        cwd=tmp_path,
    )  # fmt: skip
    child.wait_for("out", lambda line: line == "stuck")
    time.sleep(0.3)  # the scenario: SIGTERM 0.3 s after the handler blocked
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    try:
        status = child.proc.wait(GRACE + 30)  # past the bound only on failure (a hang)
    except subprocess.TimeoutExpired:
        status = None
    elapsed = time.monotonic() - sent
    child.kill()
    child.close()
    assert status == 143, child
    assert elapsed < GRACE, f"the stop took {elapsed:.1f} s, over grace={GRACE:g} s"
    err = "\n".join([*child.out, *child.err])
    assert STUCK[stuck] in err  # the abandoned handler, named with its event
    assert (tmp_path / "ckpt" / "ba5.pt").is_file()
    return err


def _check_resume(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    resumed = _finish(tmp_path)  # from the checkpoint, without the stuck callback
    assert resumed.returncode == 0, resumed.stderr
    got = torch.load(tmp_path / "final.pt", weights_only=True)
    for name, tensor in reference.items():
        assert torch.equal(got[name], tensor), name
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["name"] == "loss/train"] == list(range(1, 21))


@pytest.mark.slow
def test_torchruns_shutdown_timeout_in_the_environment_bounds_the_stop(tmp_path: Path) -> None:
    """``TORCH_ELASTIC_SHUTDOWN_TIMEOUT=8`` and ``Preemption()`` (no ``grace=``), a handler
    stuck for 90 s: the process checkpoints and exits 143 within the 8 s torchrun gives."""
    child = Child(
        [str(SCRIPT), str(tmp_path), "--stuck", "plain", "--grace", "0"], cwd=tmp_path,
        env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "8"},
    )  # fmt: skip
    child.wait_for("out", lambda line: line == "stuck")
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    try:
        status = child.proc.wait(60)
    except subprocess.TimeoutExpired:
        status = None
    elapsed = time.monotonic() - sent
    child.kill()
    child.close()
    assert status == 143, child
    assert elapsed < 8, f"the stop took {elapsed:.1f} s, over torchrun's 8 s"
    assert (tmp_path / "ckpt" / "ba5.pt").is_file()
