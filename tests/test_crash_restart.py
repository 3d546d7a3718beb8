"""Killed twice before its first checkpoint, started again: every destination tells one history.

``tests/crash_child.py`` with every destination (the HTTP uploader, a JSON-lines file, an
``MLflowLogger`` on a real ``mlflow server``, a ``TensorBoardLogger``, an offline
``WandBLogger`` with W&B's defaults) and ``--attempts`` (``half`` carries ``1000 x`` the
number of earlier starts) is killed with SIGKILL at batch 3, before its first checkpoint
(batch 5), twice, and then runs to the end, each time with ``load_path`` naming its saver's
folder. The folder held no checkpoint, only the run's start (``.trainbus-start.json``,
``checkpoint/run_start.py``). Read back with each one's reader, every destination holds
each ``(name, step)`` once, one MLflow run and one W&B run id; each step's ``half`` is the
value of the first start that got it into the destination (the replay rule), so the
starts' values follow one another. Before issue 53 W&B made a run per start (three run
ids), and the other destinations held steps 1-3 once per start.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.loggers.mlflow_server import MLflowServer
from tests.loggers.test_http_uploader import MetricsServer
from tests.loggers.wandb_files import offline_env
from tests.test_crash_consistency import TOTAL
from tests.test_crash_destinations import destinations
from tests.test_crash_wandb import run_and_kill
from trainbus.checkpoint.run_start import START_NAME


@pytest.mark.slow  # 3 processes with every destination and a real mlflow server: ~1 min
@pytest.mark.timeout(900)  # the mlflow server's start alone can take minutes under load
def test_two_kills_before_the_first_checkpoint_leave_one_history(
    tmp_path: Path, mlflow_server: MLflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)  # the children inherit it
    exp = f"restart-{uuid.uuid4().hex[:8]}"
    extra = ("--mlflow", mlflow_server.url, exp, "--tensorboard", "--wandb", "--attempts")
    workdir = tmp_path / "run"
    workdir.mkdir()
    server = MetricsServer()
    try:
        for _ in range(2):
            run_and_kill(workdir, server.url, 3, 0.0, extra=extra, saved=0)
            assert not list((workdir / "ckpt").glob("*.pt"))  # killed before any checkpoint
            assert (workdir / "ckpt" / START_NAME).exists()
        run_and_kill(workdir, server.url, None, 0.0, extra=extra)
        got = destinations(workdir, server, mlflow_server, exp)  # one W&B and MLflow run
    finally:
        server.close()
    names = ("half", "weight/norm", "loss/train")
    batch_keys = {(n, s) for n in names for s in range(1, TOTAL + 1)}
    reference = Counter((n, s) for n, s, _ in got["server"])
    assert set(reference.values()) == {1} and len(reference) == 3 * TOTAL + 3
    assert batch_keys <= set(reference)
    for name, points in got.items():
        assert set(points.values()) == {1}, (name, [p for p, n in points.items() if n > 1])
        assert Counter((n, s) for n, s, _ in points) == reference, name
        half = sorted((s, v) for n, s, v in points if n == "half")
        starts = [round((v - s * 0.5) / 1000) for s, v in half]
        assert starts == sorted(starts), (name, starts)  # the first start to get it in
        assert starts[-1] == 2, (name, starts)  # the run that finished logged the end
