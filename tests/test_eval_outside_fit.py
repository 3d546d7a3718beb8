"""``await trainer.eval()`` / ``eval_sync()`` and ``trainer.save_checkpoint()``: an
evaluation pass with its events outside ``fit()`` (after it, after a load, on its own),
and a checkpoint written as ``CheckpointSaver`` writes one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import EventLog, TinyModel, make_loader, make_trainer
from trainbus import Callback, Event, FitInProgressError, Trainer
from trainbus.loggers import InMemoryLogger

E = Event
EVAL_PASS = [E.EVAL_START, *[E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD,
             E.EVAL_AFTER_FORWARD, E.EVAL_BATCH_END] * 2, E.EVAL_END]  # fmt: skip


class AsyncEvalLog(Callback):
    """An ``async def`` handler of each eval event: counts, on the loop."""

    def __init__(self) -> None:
        self.seen: dict[Event, int] = {}

    async def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.seen[event] = self.seen.get(event, 0) + 1


@pytest.mark.anyio
async def test_eval_alone_runs_one_cycle_with_init_and_each_eval_event_once() -> None:
    log, alog, mem = EventLog(), AsyncEvalLog(), InMemoryLogger()
    trainer = make_trainer(2, callbacks=[log, alog], loggers=[mem])  # INIT at fit time (a loop)
    metrics = await trainer.eval(make_loader(2, seed=1))
    assert log.names == [E.INIT, *EVAL_PASS]
    assert (log.closed, log.post_closed) == (1, 1)
    assert alog.seen == {E.INIT: 1, E.EVAL_START: 1, E.EVAL_BATCH_START: 2,
                         E.EVAL_BEFORE_FORWARD: 2, E.EVAL_AFTER_FORWARD: 2,
                         E.EVAL_BATCH_END: 2, E.EVAL_END: 1}  # fmt: skip
    assert set(metrics) == {"eval/loss"}
    assert mem.most_recent_values["eval/loss"] == pytest.approx(metrics["eval/loss"])
    assert trainer.state.model.training  # left in training mode


@pytest.mark.anyio
async def test_eval_after_fit_is_a_cycle_of_its_own_at_the_trained_step() -> None:
    log, mem = EventLog(), InMemoryLogger()
    trainer = make_trainer(3, callbacks=[log], loggers=[mem], eval_batches=2)
    await trainer.fit()
    fit_events = list(log.events)
    metrics = await trainer.eval()  # the trainer's eval_dataloader
    assert log.events[len(fit_events):] == [(e, 3) for e in EVAL_PASS]  # no INIT again
    assert (log.closed, log.post_closed) == (2, 2)
    assert mem.steps["eval/loss"] == [3, 3]  # fit's evaluation, then this one
    assert metrics["eval/loss"] == pytest.approx(mem.most_recent_values["eval/loss"])
    await trainer.fit(duration="1ep")  # fit goes on after it
    assert int(trainer.state.timer.batch) == 6


def test_eval_sync_in_a_script_runs_init_in_the_constructor_once(anyio_backend: str) -> None:
    log = EventLog()
    trainer = make_trainer(2, callbacks=[log])
    assert log.names == [E.INIT]
    first = trainer.eval_sync(make_loader(2, seed=1), backend=anyio_backend)  # type: ignore[arg-type]
    second = trainer.eval_sync(make_loader(2, seed=1), backend=anyio_backend)  # type: ignore[arg-type]
    assert log.names == [E.INIT, *EVAL_PASS, *EVAL_PASS]
    assert first == second  # nothing trained between them


def test_eval_of_a_loaded_checkpoint_gives_the_trained_models_metrics(
    tmp_path: Path, anyio_backend: str
) -> None:
    trainer = make_trainer(4, epochs=2)
    trainer.fit_sync()
    held_out = make_loader(3, seed=7)
    trained = trainer.eval_sync(held_out, backend=anyio_backend)  # type: ignore[arg-type]
    path = trainer.save_checkpoint(tmp_path / "sub" / "final.pt")
    assert path == tmp_path / "sub" / "final.pt" and path.is_file()

    fresh = make_trainer(4, epochs=2)
    untrained = fresh.eval_sync(held_out, backend=anyio_backend)  # type: ignore[arg-type]
    assert untrained != trained
    log = EventLog()
    loaded = make_trainer(4, epochs=2, callbacks=[log], load_path=path)
    assert int(loaded.state.timer.batch) == 8  # the timer came back with the weights
    assert loaded.eval_sync(held_out, backend=anyio_backend) == trained  # type: ignore[arg-type]
    assert log.names == [E.INIT, *EVAL_PASS[:1], *EVAL_PASS[1:5] * 3, E.EVAL_END]


def test_a_saved_checkpoint_resumes_training_where_it_stopped(tmp_path: Path) -> None:
    trainer = make_trainer(2, epochs=1)
    trainer.fit_sync()
    trainer.save_checkpoint(tmp_path / "ep1.pt")
    resumed = make_trainer(2, epochs=2, load_path=tmp_path / "ep1.pt")
    resumed.fit_sync()
    straight = make_trainer(2, epochs=2)
    straight.fit_sync()
    pairs = zip(resumed.state.model.parameters(), straight.state.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_weights_only_saves_the_weights() -> None:
    import tempfile

    trainer = make_trainer(2)
    with tempfile.TemporaryDirectory() as tmp:
        path = trainer.save_checkpoint(Path(tmp) / "w.pt", weights_only=True)
        payload = torch.load(path, weights_only=False)
    assert payload["weights_only"] is True
    assert "optimizers" not in payload and "model" in payload


def test_eval_without_batches_names_both_ways_to_give_them() -> None:
    trainer = make_trainer(2)
    with pytest.raises(ValueError, match=r"eval\(dataloader=test_loader\).*eval_dataloader="):
        trainer.eval_sync()
    with pytest.raises(TypeError, match=r"dataloader is a TensorDataset, a map-style Dataset"):
        trainer.eval_sync(make_loader(2).dataset)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_eval_and_save_during_a_fit_are_refused() -> None:
    errors: list[BaseException] = []

    class During(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            try:
                await trainer.eval()
            except FitInProgressError as exc:
                errors.append(exc)
            try:
                trainer.save_checkpoint("x.pt")
            except FitInProgressError as exc:
                errors.append(exc)

    trainer = Trainer(TinyModel(), make_loader(1), "1ba", callbacks=[During()])
    await trainer.fit()
    assert len(errors) == 2
    assert "await the running fit()" in str(errors[0])
    assert "CheckpointSaver" in str(errors[1])
