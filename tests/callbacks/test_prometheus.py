"""PrometheusMetrics: /metrics from a registry of its own, /healthz that knows whether
batches complete (stuck training thread: stalled; a long checkpoint: paused, not stalled)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer, blocking
from trainbus.callbacks import CheckpointSaver, PrometheusMetrics, RunWatch
from trainbus.loggers import InMemoryLogger

WAIT = 30.0  # seconds a test waits for a state it synchronises on, at most


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = get(url + "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def health(url: str) -> tuple[int, dict[str, Any]]:
    status, body = get(url + "/healthz")
    return status, json.loads(body)


def until(predicate: Any, what: str) -> Any:
    """Poll ``predicate()`` (an HTTP reading) until it returns something truthy."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Gate(Callback):
    """Holds the training thread in a ``@blocking`` ``batch_end`` at ``at`` until released."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = threading.Event()
        self.release = threading.Event()

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timestamp.batch) == self.at:
            self.reached.set()
            assert self.release.wait(WAIT)


def test_metrics_of_two_runs_in_one_process_do_not_collide() -> None:
    first, second = PrometheusMetrics(labels={"run": "a"}), PrometheusMetrics()
    with first, second:
        Trainer(TinyModel(), make_loader(6), "1ep", callbacks=[first]).fit_sync()
        Trainer(TinyModel(), make_loader(4), "2ep", callbacks=[second],
                loggers=[InMemoryLogger()]).fit_sync()  # loss/train is logged (to it)
        a, b = samples(first.url), samples(second.url)
    assert a[("trainbus_batches_total", (("run", "a"),))] == 6
    assert b[("trainbus_batches_total", ())] == 8
    assert b[("trainbus_samples_total", ())] == 32
    assert b[("trainbus_epochs_total", ())] == 2
    # The step-time histogram: one step a batch but the fit's first.
    assert b[("trainbus_step_duration_seconds_count", ())] == 7
    assert b[("trainbus_step_duration_seconds_bucket", (("le", "+Inf"),))] == 7
    assert abs(b[("trainbus_last_step_timestamp_seconds", ())] - time.time()) < 60
    assert ("trainbus_scalar", (("name", "loss/train"),)) in b
    # Each callback's time and queue, from the bus's statistics (the watch is one).
    assert b[("trainbus_callback_calls_total", (("callback", "PrometheusMetrics"),))] > 0
    assert ("trainbus_callback_queue_depth", (("callback", "PrometheusMetrics"),)) in b
    assert ("trainbus_barrier_wait_seconds_total", ()) in b
    assert b[("trainbus_health", (("status", "ended"),))] == 1


def test_scalar_gauges_are_bounded() -> None:
    class Many(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            logger.log_metrics({f"m{i}": i for i in range(10)})

    watch = RunWatch(max_scalars=4)
    Trainer(TinyModel(), make_loader(2), "1ep", callbacks=[Many(), watch],
            log_train_loss=False).fit_sync()  # fmt: skip
    assert sorted(watch.scalars) == ["m0", "m1", "m2", "m3"]
    assert watch.scalars_dropped == 12


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"port": -1}, "port=-1"), ({"stall_factor": 0}, "stall_factor=0"),
     ({"stall_floor": float("nan")}, "stall_floor=nan"), ({"labels": {"a-b": "x"}}, "labels=")],
)  # fmt: skip
def test_bad_arguments_are_named(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        PrometheusMetrics(**kwargs)


def test_healthz_turns_stalled_on_a_stuck_training_thread_and_healthy_when_it_moves() -> None:
    first, second = Gate(at=4), Gate(at=8)
    metrics = PrometheusMetrics(stall_floor=1.0, stall_factor=2.0)
    status, body = health(metrics.url)
    assert (status, body["status"]) == (503, "starting")
    trainer = Trainer(TinyModel(), make_loader(12), "1ep", callbacks=[first, second, metrics])
    done = threading.Thread(target=trainer.fit_sync)
    done.start()
    try:
        assert first.reached.wait(WAIT)
        # Stuck in a handler: healthy until the deadline passes, then stalled (503).
        status, body = until(lambda: (r := health(metrics.url))[1]["status"] == "stalled" and r,
                             "stalled")  # fmt: skip
        assert status == 503 and not body["ok"]
        assert body["seconds_since_step"] > body["deadline"] >= 1.0
        assert samples(metrics.url)[("trainbus_healthy", ())] == 0
        first.release.set()
        assert second.reached.wait(WAIT)  # batches completed again (4 of them)
        status, body = health(metrics.url)
        assert (status, body["status"], body["batches"]) == (200, "healthy", 8)
    finally:
        first.release.set()
        second.release.set()
        done.join(WAIT)
    assert health(metrics.url)[1]["status"] == "ended"
    metrics.stop()


class SlowState(Callback):
    """A checkpoint's capture (on the training thread) that lasts until released."""

    def __init__(self) -> None:
        self.capturing = threading.Event()
        self.release = threading.Event()

    def state_dict(self) -> dict[str, Any]:
        if not self.release.is_set():
            self.capturing.set()
            assert self.release.wait(WAIT)
        return {}


def test_healthz_stays_healthy_through_a_long_checkpoint(tmp_path: Path) -> None:
    slow = SlowState()
    metrics = PrometheusMetrics(stall_floor=0.3, stall_factor=2.0)
    saver = CheckpointSaver(tmp_path, save_interval="3ba")
    trainer = Trainer(TinyModel(), make_loader(8), "1ep", callbacks=[slow, saver, metrics])
    done = threading.Thread(target=trainer.fit_sync)
    done.start()
    try:
        assert slow.capturing.wait(WAIT)
        # Past the deadline inside the capture: paused (200), never stalled.
        def past_deadline() -> dict[str, Any] | None:
            status, body = health(metrics.url)
            assert (status, body["status"]) == (200, "paused"), body
            return body if body["seconds_since_step"] > body["deadline"] else None

        assert until(past_deadline, "a checkpoint past the deadline")["reason"] == (
            "a checkpoint runs"
        )
        slow.release.set()
        # The clock counts from the pause's end: healthy right after, not stalled.
        assert health(metrics.url)[1]["status"] in ("healthy", "paused", "ended")
    finally:
        slow.release.set()
        done.join(WAIT)
    assert saver.statistics().written >= 1
    assert samples(metrics.url)[("trainbus_checkpoints_written_total", ())] >= 1
    metrics.stop()


def test_a_fit_that_raises_is_failed_and_counted() -> None:
    class Boom(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timestamp.batch) == 2:
                raise RuntimeError("boom")

    watch = RunWatch()
    trainer = Trainer(TinyModel(), make_loader(4), "1ep", callbacks=[Boom(), watch])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit_sync()
    assert (watch.health().status, watch.health().ok, watch.fits_failed) == ("failed", True, 1)


def test_the_engine_names_the_blocking_handler_the_training_thread_runs() -> None:
    seen: list[str | None] = []

    class Asks(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            seen.append(trainer.engine.training_thread_handler())

    trainer = Trainer(TinyModel(), make_loader(2), "1ep", callbacks=[Asks()])
    assert trainer.engine.training_thread_handler() is None
    trainer.fit_sync()
    assert [name.rsplit(".", 2)[-2:] for name in seen if name] == [["Asks", "batch_end"]] * 2
    assert trainer.engine.training_thread_handler() is None
