"""``trainbus.integrations.ray`` under a real local Ray cluster (issue 44; slow suite).

One cluster (``ray.init(num_cpus=2)``, its files under the test's temporary folder) serves
the module; each ``TorchTrainer`` runs 2 CPU workers on gloo. No part of Ray is mocked.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations import ray_workers
from tests.integrations.ray_workers import BATCHES, EPOCHS, train_loop

# Ray is imported by the tests, not at collection: importing it takes tens of seconds on a busy
# machine, and the default suite (which leaves these slow tests out) still collects this file.

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # a 2-worker fit takes about a minute or two on 2 busy cores
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

LAST = BATCHES * EPOCHS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    ray = pytest.importorskip("ray")
    root = tmp_path_factory.mktemp("ray")
    ray.cloudpickle.register_pickle_by_value(ray_workers)
    for attempt in range(3):  # Ray gives its raylet 30 s to start: too little on a busy machine
        try:
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                object_store_memory=100 * 1024**2,
                _temp_dir=str(root / f"t{attempt}"),
                log_to_driver=False,
            )
            break
        except Exception as exc:
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
    try:
        yield root
    finally:
        ray.shutdown()


def fit(root: Path, name: str, config: dict[str, Any], max_failures: int = 0) -> Any:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(root / "results"),
            name=name,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def points(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(cluster: Path) -> tuple[Path, Any]:
    out = cluster / "whole"
    out.mkdir()
    return out, fit(cluster, "whole", {"out": str(out)})


def test_fit_reports_rank_zeros_metrics_and_a_checkpoint_that_resumes(
    uninterrupted: tuple[Path, Any],
) -> None:
    from trainbus import CheckpointWarning, Trainer

    out, result = uninterrupted
    assert out.joinpath("starts.txt").read_text().split() == ["0", "2", "cpu"]
    logged = points(out / "metrics.jsonl")  # rank zero's (JSONLinesLogger is rank-zero-only)
    last_loss = [p for p in logged if p["name"] == "loss/train"][-1]
    assert last_loss["step"] == LAST
    assert result.metrics["loss/train"] == pytest.approx(last_loss["value"])
    # The last report is the saver's save at the last BATCH_CHECKPOINT (before EPOCH_END
    # advanced the epoch); FIT_END at that batch is not reported again.
    assert result.metrics["batch"] == LAST and result.metrics["epoch"] == EPOCHS - 1
    # Ray kept 2 checkpoints (num_to_keep=2), the last one the saver's file of the last batch.
    assert len(result.best_checkpoints) == 2
    with result.checkpoint.as_directory() as folder:
        assert sorted(p.name for p in Path(folder).iterdir()) == [
            f"ep{EPOCHS - 1}-ba{LAST}-rank0.pt"
        ]
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with pytest.warns(CheckpointWarning, match="JSONLinesLogger#0, which is not in this run"):
            trainer = Trainer(  # without the run's logger: its state is left out, with a warning
                model, ray_workers._data(), f"{EPOCHS + 1}ep", optimizers=opt, device="cpu",
                loss_fn=torch.nn.functional.cross_entropy, load_path=folder,
            )
    final = torch.load(out / "final.pt")
    assert int(trainer.state.timer.batch) == LAST
    for name, value in model.state_dict().items():
        assert torch.equal(value, final["model"][name]), name
    momentum = opt.state_dict()["state"]
    for key, saved in final["optimizer"]["state"].items():
        assert torch.equal(momentum[key]["momentum_buffer"], saved["momentum_buffer"])


def test_a_killed_worker_restarts_from_the_last_report_and_ends_like_the_whole_run(
    cluster: Path, uninterrupted: tuple[Path, Any]
) -> None:
    whole, _ = uninterrupted
    out = cluster / "killed"
    out.mkdir()
    result = fit(cluster, "killed", {"out": str(out), "kill_at": 5}, max_failures=1)
    assert out.joinpath("killed").exists()
    starts = out.joinpath("starts.txt").read_text().splitlines()
    assert [line.split()[0] for line in starts] == ["0", "4"]  # resumed from batch 4's report
    final, expected = torch.load(out / "final.pt"), torch.load(whole / "final.pt")
    for name, value in expected["model"].items():
        assert torch.equal(final["model"][name], value), name
    assert result.metrics["batch"] == LAST
    logged = Counter((p["name"], p["step"]) for p in points(out / "metrics.jsonl"))
    assert max(logged.values()) == 1  # exactly once, though batches 5.. ran twice
    assert {step for name, step in logged if name == "loss/train"} == set(range(1, LAST + 1))


def test_a_rank_zero_only_reporter_is_refused_on_every_rank_without_a_hang(
    cluster: Path,
) -> None:
    out = cluster / "refused"
    out.mkdir()
    with pytest.raises(Exception, match="RayReporter cannot be rank_zero_only"):
        fit(cluster, "refused", {"out": str(out), "rank_zero_reporter": True})


def test_the_docs_example_runs_and_prints_what_the_page_says(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.docs_pages import Page

    page = Page.read("distributed.md")
    (code,) = page.sections["Ray Train"]
    work = cluster / "docs"
    work.mkdir()
    monkeypatch.chdir(work)
    exec(compile(code, "distributed.md[Ray Train]", "exec"), {"__name__": "docs_ray"})
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed == "8 ['ep1-ba8-rank0.pt']"
    assert f"prints `{printed}`" in page.text
