"""Killed after its second checkpoint and resumed: every destination tells one history.

Each test runs ``tests/crash_child.py`` with every destination (the HTTP uploader, a
JSON-lines file, an ``MLflowLogger`` on a real ``mlflow server``, a ``TensorBoardLogger``
and an offline ``WandBLogger``) and ``--attempts``: the ``half`` metric carries ``1000 x``
the number of earlier starts, so each point tells which run logged it. The run is killed
with SIGKILL at batch 13 (checkpoints at 5 and 10), then resumed from the saver's folder
(its newest checkpoint, 10) or from its oldest (5), until it finishes. Each destination is
read back with its own reader (the server's store, the file, the MLflow client,
TensorBoard's ``EventAccumulator``, W&B's ``wandb leet inspect`` on the offline files) and
must hold every ``(name, step)`` of the uninterrupted run once, by the replay rule of
``docs/crash-consistency.md``: the killed run's values up to the last step it got into the
destination (at least the checkpoint's), the resumed run's after. The W&B and MLflow runs
are the killed run's (one run each).
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.loggers.mlflow_server import MLflowServer
from tests.loggers.test_http_uploader import MetricsServer
from tests.loggers.wandb_files import offline_env, wandb_points
from tests.test_crash_consistency import TOTAL, mlflow_points, run_until

Point = tuple[str, int, float]
KILL_AT = 13  # after the checkpoints of batches 5 and 10


def tensorboard_points(log_dir: Path) -> Counter[Point]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return Counter(
        (tag, e.step, e.value) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)
    )


def destinations(
    workdir: Path, server: MetricsServer, mlflow: MLflowServer, exp: str
) -> dict[str, Counter[Point]]:
    """Each destination's points, read back with its own reader."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    wandb_runs = wandb_points(workdir / "wb")
    assert len(wandb_runs) == 1, list(wandb_runs)  # the resumed run logs into the same run
    (wandb,) = wandb_runs.values()
    return {
        "server": Counter(
            (p["name"], p["step"], p["value"])
            for body in server.accepted.values()
            for p in body["points"]
        ),
        "jsonl": Counter((r["name"], r["step"], r["value"]) for r in map(json.loads, lines)),
        "mlflow": mlflow_points(mlflow, exp),  # asserts one MLflow run
        "tensorboard": tensorboard_points(workdir / "tb"),
        "wandb": Counter(wandb),
    }


def run(
    workdir: Path, mlflow: MLflowServer, exp: str, *, kill: bool, oldest: bool = False
) -> tuple[dict[str, Counter[Point]], dict[str, torch.Tensor]]:
    workdir.mkdir(parents=True)
    server = MetricsServer()
    extra = ("--mlflow", mlflow.url, exp, "--tensorboard", "--wandb", "--attempts")
    try:
        if kill:
            run_until(
                workdir, server.url, 5, stop_at=KILL_AT, sig=signal.SIGKILL,
                extra=(*extra, "--pause-at", str(KILL_AT)), watchdog=400,
            )  # fmt: skip
            assert sorted(p.name for p in (workdir / "ckpt").glob("*.pt")) == [
                "ep0-ba10-rank0.pt", "ep0-ba5-rank0.pt",
            ]  # fmt: skip
        resume = ("--load-oldest",) if oldest else ()
        run_until(workdir, server.url, 5, stop_at=None, extra=(*extra, *resume), watchdog=400)
        weights = torch.load(workdir / "final.pt", weights_only=True)
        return destinations(workdir, server, mlflow, exp), weights
    finally:
        server.close()


def check_replay_rule(
    name: str, got: Counter[Point], reference: Counter[Point], *, floor: int = 10
) -> None:
    """Each (name, step) once; the deterministic values as the uninterrupted run's; the
    ``half`` values the killed run's up to a step at or after ``floor`` (its newest
    checkpoint, 10) and the resumed run's (+1000) after it."""
    assert set(got.values()) == {1}, (name, [p for p, n in got.items() if n > 1])
    keys = Counter((n, s) for n, s, _ in got)
    assert keys == Counter((n, s) for n, s, _ in reference), name
    assert {p for p in got if p[0] != "half"} == {p for p in reference if p[0] != "half"}, name
    half = {s: v for n, s, v in got if n == "half"}
    killed = sorted(s for s, v in half.items() if v == s * 0.5)
    resumed = sorted(s for s, v in half.items() if v == s * 0.5 + 1000)
    cut = max(killed)
    assert killed == list(range(1, cut + 1)), (name, killed)
    assert resumed == list(range(cut + 1, TOTAL + 1)), (name, resumed)
    assert floor <= cut <= KILL_AT, (name, cut)


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)  # the children inherit it


@pytest.mark.slow  # ~1-2 min of real processes and a real mlflow server
@pytest.mark.timeout(900)  # the mlflow server's start alone can take minutes under load
@pytest.mark.usefixtures("wandb_offline")
def test_every_destination_holds_one_history_after_a_kill_and_resumes(
    tmp_path: Path, mlflow_server: MLflowServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(3) as pool:
        ref = pool.submit(run, tmp_path / "ref", mlflow_server, f"ref-{tag}", kill=False)
        newest = pool.submit(run, tmp_path / "new", mlflow_server, f"new-{tag}", kill=True)
        oldest = pool.submit(
            run, tmp_path / "old", mlflow_server, f"old-{tag}", kill=True, oldest=True
        )
        (reference, ref_weights), runs = ref.result(), [newest.result(), oldest.result()]
    assert set(reference["server"].values()) == {1} and len(reference["server"]) == 3 * TOTAL + 3
    for name, points in reference.items():
        assert Counter((n, s) for n, s, _ in points) == Counter(
            (n, s) for n, s, _ in reference["server"]
        ), name
    for (got, weights), oldest in zip(runs, (False, True), strict=True):
        for key, tensor in ref_weights.items():
            assert torch.equal(weights[key], tensor), key
        for name, points in got.items():
            # W&B writes its rows every 15 s (its default): the killed run's rows after the
            # checkpoint of 5 were only in the checkpoint of 10, which a run resumed from
            # the oldest does not read, so it logs steps 6-10 itself (the replay rule)
            floor = 5 if oldest and name == "wandb" else 10
            check_replay_rule(name, points, reference[name], floor=floor)
