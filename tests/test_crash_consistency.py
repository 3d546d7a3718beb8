"""Killed at any moment, resumed from the last checkpoint: nothing lost, nothing counted twice.

Each test runs ``tests/crash_child.py`` (3 epochs x 20 batches of ~50 ms, a checkpoint every
5 batches or every batch, an ``HTTPMetricsUploader`` with a journal posting to a real
server on 127.0.0.1, a ``JSONLinesLogger``) in subprocesses: an uninterrupted reference
run, then a run stopped at a progress point the child reports on stdout (SIGKILL, or
SIGTERM with ``Trainer(preemption=...)``), resumed with ``load_path`` until it finishes.
The final weights must equal the reference's, and the server and the JSON-lines file must
hold exactly the reference's ``(name, step, value)`` points, each once.

The default suite runs one SIGKILL and one SIGTERM case; the rest is ``@pytest.mark.slow``.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.loggers.mlflow_server import MLflowServer
from tests.loggers.test_http_uploader import MetricsServer
from tests.loggers.test_mlflow import history

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "tests" / "crash_child.py"
TOTAL = 60  # batches of the full run

Point = tuple[str, int, float]


@dataclass
class Outcome:
    """What a (possibly interrupted and resumed) run left behind."""

    weights: dict[str, torch.Tensor]
    server: Counter[Point]
    jsonl: Counter[Point]
    conflicts: list[str]


def _child(workdir: Path, url: str, every: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(workdir), url, str(every), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_until(
    workdir: Path, url: str, every: int, *, stop_at: int | None, sig: int = signal.SIGKILL,
    extra: tuple[str, ...] = (), watchdog: float = 120,
) -> int:
    """Run the child; once it reports batch ``stop_at`` (with a checkpoint on disk), send
    ``sig``. Returns the exit status. A child still running after ``watchdog`` seconds is
    killed (and the test fails)."""
    extra = (*extra, "--preemption") if sig == signal.SIGTERM else extra
    child = _child(workdir, url, every, *extra)
    assert child.stdout is not None and child.stderr is not None
    timer = threading.Timer(watchdog, child.kill)
    timer.start()
    sent = False
    try:
        for line in child.stdout:
            words = line.split()
            if stop_at is None or sent or words[:1] != ["batch"]:
                continue
            if int(words[1]) >= stop_at and int(words[3]) >= 1:
                child.send_signal(sig)
                sent = True
        child.wait()
        err = child.stderr.read()
    finally:
        timer.cancel()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    if stop_at is None or sig == signal.SIGTERM:
        expected = 0 if stop_at is None else 143
        assert child.returncode == expected, err
    assert stop_at is None or sent, f"the child finished before batch {stop_at}: {err}"
    return child.returncode


def collect(workdir: Path, server: MetricsServer) -> Outcome:
    points: Counter[Point] = Counter(
        (p["name"], p["step"], p["value"])
        for body in server.accepted.values()
        for p in body["points"]
    )
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    jsonl = Counter((r["name"], r["step"], r["value"]) for r in map(json.loads, lines))
    weights = torch.load(workdir / "final.pt", weights_only=True)
    return Outcome(weights, points, jsonl, list(server.conflicts))


def interrupted(
    tmp_path: Path, every: int, stops: list[int], sig: int, *extra: str
) -> Outcome:
    """Stop the run at each of ``stops`` in turn (resuming in between), then finish it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    server = MetricsServer()
    try:
        for stop in stops:
            run_until(tmp_path, server.url, every, stop_at=stop, sig=sig, extra=extra)
        run_until(tmp_path, server.url, every, stop_at=None, extra=extra)
        return collect(tmp_path, server)
    finally:
        server.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    return interrupted(tmp_path_factory.mktemp("reference"), 5, [], signal.SIGKILL)


def check(outcome: Outcome, reference: Outcome) -> None:
    assert set(outcome.weights) == set(reference.weights)
    for name, tensor in reference.weights.items():
        assert torch.equal(outcome.weights[name], tensor), name
    assert outcome.conflicts == []  # a resent key always carried the same points
    assert set(reference.server.values()) == {1}
    assert outcome.server == reference.server
    assert outcome.jsonl == reference.jsonl
    assert set(outcome.jsonl.values()) == {1}


@pytest.mark.slow  # 21 s of real processes; the default suite keeps the other crash tests
def test_killed_or_preempted_then_resumed_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """The fast case (default suite): the reference, a run killed with SIGKILL after batch
    23 and a run stopped by SIGTERM after batch 32 (exit status 143), each then resumed,
    run side by side (their processes mostly wait for the model's 50 ms forward); and a
    run killed after batch 17 whose uploader has only a ``spool_dir`` (``journal`` left at
    its default): with the run's ``CheckpointSaver`` it journals, so no point is stored
    twice (before issue 32, 4 points were)."""
    with ThreadPoolExecutor(4) as pool:
        ref = pool.submit(interrupted, tmp_path / "ref", 5, [], signal.SIGKILL)
        killed = pool.submit(interrupted, tmp_path / "kill", 5, [23], signal.SIGKILL)
        stopped = pool.submit(interrupted, tmp_path / "term", 5, [32], signal.SIGTERM)
        default = pool.submit(
            interrupted, tmp_path / "default", 5, [17], signal.SIGKILL, "--default-journal"
        )
        reference = ref.result()
        names = {name for name, _, _ in reference.server}
        assert names == {"loss/train", "weight/norm", "half", "eval/loss"}
        assert len(reference.server) == 3 * TOTAL + 3
        assert reference.jsonl == reference.server
        check(killed.result(), reference)
        check(stopped.result(), reference)
        check(default.result(), reference)


def mlflow_points(server: MLflowServer, experiment: str) -> Counter[Point]:
    """``(key, step, value)`` of every metric point of the experiment's one run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # the resumed run reuses it
    return history(server, runs[0].info.run_id)


@pytest.mark.slow
def test_mlflow_killed_and_resumed_holds_each_point_once(
    tmp_path: Path, mlflow_server: MLflowServer
) -> None:
    """An ``MLflowLogger`` with a ``spool_dir`` (``journal`` left at its default) in a run
    killed with SIGKILL after batch 23 and resumed: one MLflow run holding every point of
    the uninterrupted run once (before issue 32 the resumed run made a second MLflow run)."""
    tag = uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(2) as pool:
        ref = pool.submit(
            interrupted, tmp_path / "ref", 5, [], signal.SIGKILL,
            "--mlflow", mlflow_server.url, f"ref-{tag}",
        )  # fmt: skip
        killed = pool.submit(
            interrupted, tmp_path / "kill", 5, [23], signal.SIGKILL,
            "--mlflow", mlflow_server.url, f"kill-{tag}",
        )  # fmt: skip
        reference, outcome = ref.result(), killed.result()
    expected = mlflow_points(mlflow_server, f"ref-{tag}")
    assert set(expected.values()) == {1} and len(expected) == len(reference.server)
    got = mlflow_points(mlflow_server, f"kill-{tag}")
    assert got == expected
    check(outcome, reference)


@pytest.mark.slow
@pytest.mark.parametrize("every", [5, 1])
@pytest.mark.parametrize("stop", [1, 19, 20, 21, 58])
def test_sigkill_at_chosen_points(
    tmp_path: Path, reference: Outcome, every: int, stop: int
) -> None:
    check(interrupted(tmp_path, every, [stop], signal.SIGKILL), reference)


@pytest.mark.slow
@pytest.mark.parametrize("every", [5, 1])
@pytest.mark.parametrize("seed", range(2))
def test_sigkill_at_random_points_several_times(
    tmp_path: Path, reference: Outcome, every: int, seed: int
) -> None:
    rng = random.Random(seed)
    stops = sorted(rng.sample(range(1, TOTAL - 1), 3))
    check(interrupted(tmp_path, every, stops, signal.SIGKILL), reference)


@pytest.mark.slow
@pytest.mark.parametrize("every", [5, 1])
@pytest.mark.parametrize("stop", [20, 47])
def test_sigterm_at_chosen_points(
    tmp_path: Path, reference: Outcome, every: int, stop: int
) -> None:
    check(interrupted(tmp_path, every, [stop], signal.SIGTERM), reference)
