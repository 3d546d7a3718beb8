"""The fault suite (issue 12): an ``Exception``, a ``SystemExit``, a custom
``BaseException`` and a cancellation, injected from a plain, an ``async`` and a
``@blocking`` handler at every event, from the model's forward, the loss and the
dataloader, and from ``close`` / ``post_close``. In every case:

- ``fit()`` raises the injected error itself (or the cancellation propagates), within
  the safety bound;
- ``close`` ran once on every callback, ``post_close`` once on each, after every close;
- every point logged before the fault is in the JSON-lines file, and delivered to the
  metrics server on 127.0.0.1 or left in the uploader's spool;
- no trainbus thread is alive afterwards, and a new trainer then trains normally.

The default run takes a representative subset (each fault, each source kind, both
backends); ``-m slow`` runs the whole cross product (about 1,300 runs).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.failures._faults import (
    EPOCHS,
    FAULTS,
    FaultyLoader,
    FaultyModel,
    Injector,
    faulty_callback,
    sources,
)
from tests.failures._harness import (
    CloseOrder,
    Probe,
    SmallServer,
    closing,
    jsonl_points,
    run_bounded,
    server_fixture,
    spooled_points,
    trainbus_threads,
)
from tests.helpers import EventLog, TinyModel, make_loader, make_trainer
from trainbus import Callback, Event, Trainer, blocking
from trainbus.loggers import HTTPMetricsUploader, JSONLinesLogger

RECORDERS = ["PlainRecorder", "AsyncRecorder", "BlockingRecorder", "Faulty"]


class BlockingCloser(Callback):
    """A callback with ``@blocking`` handlers (it runs on the training thread)."""

    def __init__(self) -> None:
        self.batches = 0

    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        self.batches += 1


@pytest.fixture
def server() -> Iterator[SmallServer]:
    yield from server_fixture()


def run_fault_case(
    kind: str, where: str, fault: str, backend: str, tmp_path: Path, server: SmallServer
) -> None:
    order = CloseOrder()
    injector = Injector(fault)
    probe = Probe()
    jsonl, spool = tmp_path / "metrics.jsonl", tmp_path / "spool"
    in_model = kind == "model"
    blocking_recorder = type(
        "BlockingRecorder", (closing("sync", "BlockingRecorder", order), BlockingCloser), {}
    )()
    callbacks: list[Callback] = [
        closing("sync", "PlainRecorder", order)(),
        faulty_callback("sync" if in_model else kind, "" if in_model else where, injector,
                        order),
        closing("async", "AsyncRecorder", order)(),
        blocking_recorder,
        probe,
    ]
    model = FaultyModel(where, injector) if in_model and where != "dataloader" else TinyModel()
    loader = FaultyLoader(injector if where == "dataloader" else None)

    async def scenario() -> dict[str, Any]:
        trainer = Trainer(  # built on the loop: INIT is delivered by fit(), not here
            model,
            loader,
            f"{EPOCHS}ep",
            eval_dataloader=make_loader(1, seed=1),
            callbacks=callbacks,
            loggers=[
                JSONLinesLogger(jsonl, flush_seconds=60.0),  # written out only by close
                HTTPMetricsUploader(
                    server.url, spool_dir=spool, flush_seconds=0.05, backoff=0.01,
                    close_timeout=5.0,
                ),
            ],
            close_timeout=5,
        )
        result: dict[str, Any] = {"error": None}
        async with anyio.from_thread.BlockingPortal() as portal:
            injector.portal = portal
            injector.loop_ident = threading.get_ident()
            with anyio.CancelScope() as scope:
                injector.scope = scope
                try:
                    await trainer.fit()
                except Exception as exc:  # the injected error, checked below
                    result["error"] = exc
                except BaseException as exc:
                    if isinstance(exc, anyio.get_cancelled_exc_class()):
                        raise
                    result["error"] = exc
        result["cancelled_caught"] = scope.cancelled_caught
        result["running"] = trainer.engine.running
        return result

    baseline = set(threading.enumerate())  # threads other tests may have left behind
    outcome = run_bounded(scenario, backend)
    assert outcome.error is None, f"the scenario itself failed: {outcome.error!r}"
    result = outcome.value
    file_points, delivered = jsonl_points(jsonl), server.points() + spooled_points(spool)
    left = [t.name for t in threading.enumerate()
            if t.name.startswith("trainbus-") and t not in baseline]
    facts = (f"\nresult={result} logged={probe.logged} jsonl={file_points} "
             f"uploaded+spooled={sorted(delivered)} closes={order.calls} threads={left}")
    assert injector.fired, f"the fault at {kind}/{where} was never reached" + facts
    if fault == "cancel":
        assert result["error"] is None, repr(result["error"]) + facts
        # Even when it comes after training (in close, or from a handler that trails),
        # the cancellation reached fit() while it ran: fit() must not swallow it.
        assert result["cancelled_caught"], "the cancellation did not propagate from fit()" + facts
    else:
        assert result["error"] is injector.error, repr(result["error"]) + facts
    assert not result["running"], facts
    order.assert_complete(RECORDERS)
    assert Counter(file_points) == Counter(probe.logged), facts
    assert Counter(delivered) >= Counter(probe.logged), facts
    assert not left, f"trainbus threads alive after fit(): {left}" + facts
    trains_normally_afterwards(backend, tmp_path)


def trains_normally_afterwards(backend: str, tmp_path: Path) -> None:
    log = EventLog()
    jsonl = tmp_path / "after.jsonl"

    async def scenario() -> None:
        trainer = make_trainer(2, callbacks=[log], loggers=[JSONLinesLogger(jsonl)])
        await trainer.fit()

    outcome = run_bounded(scenario, backend)
    assert outcome.error is None, repr(outcome.error)
    assert log.names[-1] is Event.FIT_END and (log.closed, log.post_closed) == (1, 1)
    assert [int(p) for p in jsonl_points(jsonl, "loss/train")] == [1, 2]
    assert not trainbus_threads()


# -- which cases run ---------------------------------------------------------------------

DEFAULT_CASES = [  # (kind, where, fault): every fault, every source kind, spread over events
    ("sync", "batch_end", "exception"),
    ("sync", "init", "base-exception"),
    ("sync", "eval_batch_end", "cancel"),
    ("sync", "after_loss", "system-exit"),
    ("async", "after_forward", "system-exit"),
    ("async", "fit_start", "cancel"),
    ("async", "fit_end", "exception"),
    ("async", "epoch_checkpoint", "base-exception"),
    ("blocking", "before_backward", "base-exception"),
    ("blocking", "batch_checkpoint", "exception"),
    ("blocking", "epoch_end", "cancel"),
    ("blocking", "eval_start", "system-exit"),
    ("model", "forward", "exception"),
    ("model", "forward", "cancel"),
    ("model", "loss", "base-exception"),
    ("model", "dataloader", "system-exit"),
    ("model", "dataloader", "cancel"),
    ("sync", "close", "exception"),
    ("sync", "close", "base-exception"),
    ("async", "close", "system-exit"),
    ("async", "close", "cancel"),
    ("sync", "post_close", "cancel"),
    ("async", "post_close", "exception"),
]


@pytest.mark.parametrize(
    ("kind", "where", "fault", "backend"),
    [(*case, ("asyncio", "trio")[i % 2]) for i, case in enumerate(DEFAULT_CASES)],
    ids=lambda v: str(v),
)
def test_fault(
    kind: str, where: str, fault: str, backend: str, tmp_path: Path, server: SmallServer
) -> None:
    run_fault_case(kind, where, fault, backend, tmp_path, server)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize(("kind", "where"), sources(), ids=lambda v: str(v))
def test_fault_everywhere(
    kind: str, where: str, fault: str, backend: str, tmp_path: Path, server: SmallServer
) -> None:
    run_fault_case(kind, where, fault, backend, tmp_path, server)
