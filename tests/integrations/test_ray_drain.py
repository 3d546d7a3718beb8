"""Ray's drain notice stops a trainbus run under a real local Ray cluster (issue 44; slow).

The cluster is three raylets on this machine (``ray.cluster_utils.Cluster``): a head
without CPUs (the driver and Ray Train's controller) and two nodes of 2 CPUs. Ray packs the
run's 2 workers onto one node; at batch 4 rank 0 drains that node for preemption with a
deadline through Ray's GCS (the RPC behind ``ray drain-node``). Ray Train's watcher marks
every worker, trainbus gives the notice at that batch boundary and every rank stops one
batch later with a checkpoint reported to Ray; ``integrations.ray.fit_sync`` holds the
workers until Ray, at the deadline, restarts the group on the other node from that
checkpoint, as a preemption (``max_failures=0``: a failure would end the run). No part of
Ray is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integrations import ray_workers
from tests.integrations.ray_workers import BATCHES, EPOCHS, drain_loop

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

LAST = BATCHES * EPOCHS
DRAIN_IN = 45  # seconds from the drain to its deadline


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    ray.cloudpickle.register_pickle_by_value(ray_workers)
    # The cluster's files (and the address file Cluster writes) in a short folder of its
    # own (Ray's sockets live under it: Unix socket paths are short); Ray Train's watcher
    # polls the drain state every 5 s by default: 0.5 s here (the controller and the
    # workers inherit both variables from this process).
    root = Path(tempfile.mkdtemp(prefix="tb-ray-", dir="/tmp"))
    (root / "ray").mkdir()
    variables = {"RAY_TMPDIR": str(root), "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    common = {"object_store_memory": 80 * 1024**2, "include_dashboard": False}
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **common})
    try:
        made.add_node(num_cpus=2, **common)
        made.add_node(num_cpus=2, **common)
        ray.init(address=made.address, log_to_driver=False)
        made.wait_for_nodes()
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(root, ignore_errors=True)


def test_a_drain_notice_stops_every_rank_with_a_checkpoint_reported_and_ray_restarts_from_it(
    cluster: Any, tmp_path: Path
) -> None:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = tmp_path / "out"
    out.mkdir()
    trainer = TorchTrainer(
        drain_loop,
        train_loop_config={
            "out": str(out), "gcs_address": cluster.gcs_address, "drain_in": DRAIN_IN,
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path / "results"),
            name="drained",
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=FailureConfig(max_failures=0),  # the restart is a preemption's
        ),
    )
    result = trainer.fit()

    drain = json.loads(out.joinpath("drain.json").read_text())
    sources = []
    for rank in (0, 1):
        notice = json.loads(out.joinpath(f"notice-rank{rank}.json").read_text())
        # Given at batch 4's boundary on every rank (both saw Ray's mark there): each rank
        # stopped one batch later, at 5, with a notice naming Ray's drain, or, where the
        # first rank's notice reached it through the store before its own (peer notices,
        # issue 53), that rank's, with the same deadline.
        assert notice["batch"] == 5
        sources.append(notice["source"])
        assert notice["reason"] == (
            f"Ray drains node {drain['node'][:8]} (preempted ranks [0, 1])"
            if notice["source"] == "call" else "preempted on another rank"
        )
        # The drain's deadline (Unix ms), converted to a monotonic value and back.
        assert notice["deadline_unix"] == pytest.approx(drain["deadline_ms"] / 1000, abs=0.5)
    assert "call" in sources and set(sources) <= {"call", "peer"}
    # Ray restarted the group (as a preemption: max_failures=0) from batch 5's checkpoint.
    starts = out.joinpath("starts.txt").read_text().splitlines()
    assert [line.split() for line in starts] == [["0", "2"], ["5", "2"]]
    reported = []
    for checkpoint, _metrics in result.best_checkpoints:
        with checkpoint.as_directory() as folder:
            reported.extend(p.name for p in Path(folder).iterdir())
    # The saver's interval (3, 6, 9, 12) and, before the deadline, the drain's stop at 5.
    assert "ep1-ba5-rank0.pt" in reported
    assert sorted(reported) == sorted(
        f"ep{(b - 1) // BATCHES}-ba{b}-rank0.pt" for b in (3, 5, 6, 9, 12)
    )
    assert result.metrics["batch"] == LAST
    logged = Counter(
        (p["name"], p["step"])
        for p in map(json.loads, out.joinpath("metrics.jsonl").read_text().splitlines())
    )
    assert max(logged.values()) == 1
    assert {step for name, step in logged if name == "loss/train"} == set(range(1, LAST + 1))
    assert time.time() * 1000 > drain["deadline_ms"]  # the restart came after the deadline


# -- without a cluster: Ray's own objects, no Ray process ---------------------------------------


@pytest.mark.parametrize("seconds", [30.0, None])
def test_rays_preemption_info_converts_to_a_notice_with_a_monotonic_deadline(
    seconds: float | None,
) -> None:
    from ray.train import PreemptionInfo

    from trainbus.integrations.ray import drain_notice

    deadline_ms = None if seconds is None else int(time.time() * 1000 + seconds * 1000)
    info = PreemptionInfo(
        deadline_ms=deadline_ms, preempted_node_to_ranks={"ffee0011aabb": [3, 2], "00aa": [1]}
    )
    before = time.monotonic()
    reason, deadline = drain_notice(info)
    after = time.monotonic()
    assert reason == "Ray drains node 00aa, ffee0011 (preempted ranks [1, 2, 3])"
    if seconds is None:
        assert deadline is None  # the preemption's grace period applies
    else:
        assert deadline is not None and deadline_ms is not None
        # monotonic + (t - time.time()): within the clock reads' gap and the ms rounding.
        assert before - 0.01 <= deadline - seconds <= after + 0.01


def test_the_bridges_fit_sync_raises_a_preemption_ray_is_not_draining_for(tmp_path: Path) -> None:
    from tests.helpers import make_trainer
    from trainbus import TrainingPreempted
    from trainbus.integrations.ray import RayReporter, fit_sync

    trainer = make_trainer(4)
    trainer.preempt("maintenance")  # no Ray here: nothing to wait for
    with pytest.raises(TrainingPreempted):
        fit_sync(trainer)
    assert trainer.preempted and int(trainer.state.timestamp.batch) < 4
    with pytest.raises(TypeError, match="drain_notice='yes' must be True or False"):
        RayReporter(drain_notice="yes")  # type: ignore[arg-type]
