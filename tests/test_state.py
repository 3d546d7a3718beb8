"""State: per-event views, stop requests from any thread, elapsed duration, lists, state_dict."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import EventLog, TinyModel, make_loader, make_trainer
from trainbus import Callback, Event, State, Time, Timestamp, TimeUnit, Trainer


def make_state(**kw: Any) -> State:
    kw.setdefault("model", TinyModel())
    kw.setdefault("max_duration", Time(4, "ba"))
    return State(**kw)


# --- snapshots --------------------------------------------------------------------------------


def test_view_keeps_its_events_values_while_the_live_state_changes() -> None:
    state = make_state()
    batch1, loss1, outputs1 = (torch.ones(2), torch.zeros(2)), torch.tensor(0.5), torch.ones(2, 3)
    state.batch, state.loss, state.outputs = batch1, loss1, outputs1
    state.batch_num_samples = 2
    state.current_metrics = {"eval": {"loss": 0.7}}
    state._timer.on_batch_complete(samples=2)
    view = state.snapshot()

    batch2, loss2, outputs2 = (torch.zeros(3), torch.ones(3)), torch.tensor(9.0), torch.zeros(3, 3)
    state.batch, state.loss, state.outputs = batch2, loss2, outputs2
    state.batch_num_samples = 3
    state.current_metrics = {"eval": {"loss": 0.1}}
    state._timer.on_batch_complete(samples=3)
    state._timer.on_epoch_complete()

    assert view.batch is batch1
    assert view.loss is loss1
    assert view.outputs is outputs1
    assert view.batch_num_samples == 2
    assert view.current_metrics == {"eval": {"loss": 0.7}}
    assert int(view.timer.batch) == 1
    assert int(view.timer.sample) == 2
    assert int(view.timer.epoch) == 0
    assert int(view.timer.batch_in_epoch) == 1
    assert view.timestamp == Timestamp(batch=1, batch_in_epoch=1, sample=2, sample_in_epoch=2)

    assert state.batch is batch2
    assert state.loss is loss2
    assert state.outputs is outputs2
    assert int(state.timer.batch) == 2
    assert int(state.timer.epoch) == 1


def test_view_shares_the_live_objects() -> None:
    opt = torch.optim.SGD(TinyModel().parameters(), lr=0.1)
    state = make_state(optimizers=opt)
    view = state.snapshot()
    assert view.model is state.model
    assert view.optimizers is state.optimizers
    assert view.optimizers == [opt]
    assert view.max_duration == Time(4, "ba")


def test_assigning_through_a_view_changes_the_live_state() -> None:
    state = make_state()
    view = state.snapshot()
    view.max_duration = "2ba"
    view.loss = torch.tensor(3.0)
    assert state.max_duration == Time(2, "ba")
    assert float(state.loss) == 3.0
    assert view.loss is None  # the view itself stays as it was


def test_view_timer_is_read_only_and_a_view_is_its_own_snapshot() -> None:
    state = make_state()
    view = state.snapshot()
    assert isinstance(view.timer, Timestamp)
    with pytest.raises(AttributeError):
        view.timer._batch = 5  # type: ignore[union-attr]
    assert view.snapshot() is view


# --- stop_training ----------------------------------------------------------------------------


def test_stop_training_from_another_thread() -> None:
    state = make_state()
    assert not state.stop_requested
    thread = threading.Thread(target=state.stop_training)
    thread.start()
    thread.join()
    assert state.stop_requested
    assert state.snapshot().stop_requested


class StopFromThreadAt(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            thread = threading.Thread(target=state.stop_training)
            thread.start()
            thread.join()


def test_stop_training_from_another_thread_stops_at_the_next_batch_boundary() -> None:
    log = EventLog()
    trainer = make_trainer(n_batches=10, callbacks=[StopFromThreadAt(2), log])
    trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 2
    batch_ends = [batch for event, batch in log.events if event is Event.BATCH_END]
    assert batch_ends == [1, 2]
    assert log.names[-1] is Event.FIT_END
    assert log.closed == 1
    assert log.post_closed == 1


# --- get_elapsed_duration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_duration", "batches", "samples_per_batch", "epochs", "expected"),
    [
        ("4ba", 0, 8, 0, 0.0),
        ("4ba", 1, 8, 0, 0.25),
        ("4ba", 3, 8, 0, 0.75),
        ("4ba", 4, 8, 1, 1.0),
        ("2ep", 3, 8, 1, 0.5),
        ("100sp", 1, 25, 0, 0.25),
        ("100sp", 2, 25, 0, 0.5),
        ("4ba", 6, 8, 0, 1.0),  # past max_duration (e.g. a continued fit): capped
    ],
)
def test_get_elapsed_duration(
    max_duration: str, batches: int, samples_per_batch: int, epochs: int, expected: float
) -> None:
    state = make_state(max_duration=max_duration)
    for _ in range(batches):
        state._timer.on_batch_complete(samples=samples_per_batch)
    for _ in range(epochs):
        state._timer.on_epoch_complete()
    elapsed = state.get_elapsed_duration()
    assert isinstance(elapsed, Time)
    assert elapsed.unit is TimeUnit.DURATION
    assert elapsed.value == pytest.approx(expected)


def test_get_elapsed_duration_of_a_view_uses_its_own_timestamp() -> None:
    state = make_state(max_duration="4ba")
    state._timer.on_batch_complete()
    view = state.snapshot()
    state._timer.on_batch_complete()
    assert view.get_elapsed_duration().value == pytest.approx(0.25)
    assert state.get_elapsed_duration().value == pytest.approx(0.5)


# --- optimizers and schedulers are lists ------------------------------------------------------


def test_optimizers_and_schedulers_are_always_lists() -> None:
    model = TinyModel()
    opt1 = torch.optim.SGD(model.parameters(), lr=0.1)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.2)
    sched = torch.optim.lr_scheduler.StepLR(opt1, step_size=1)

    assert make_state().optimizers == []
    assert make_state().schedulers == []
    assert make_state(optimizers=opt1, schedulers=sched).optimizers == [opt1]
    assert make_state(optimizers=opt1, schedulers=sched).schedulers == [sched]
    assert make_state(optimizers=(opt1, opt2)).optimizers == [opt1, opt2]
    assert make_state(optimizers=None, schedulers=None).schedulers == []

    state = make_state(optimizers=[opt1])
    same_list = state.optimizers
    state.optimizers = opt2  # one optimizer: stored as a list, in the same list object
    assert state.optimizers == [opt2]
    assert state.optimizers is same_list
    state.schedulers = sched
    assert state.schedulers == [sched]
    state.snapshot().schedulers = (sched, sched)
    assert state.schedulers == [sched, sched]
    assert type(state.optimizers) is list
    assert type(state.schedulers) is list


def test_trainer_state_holds_lists() -> None:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    trainer = Trainer(model, make_loader(2), "1ep", optimizers=opt, schedulers=sched)
    assert trainer.state.optimizers == [opt]
    assert trainer.state.schedulers == [sched]
    assert trainer.state.model is model


def test_max_duration_accepts_strings_and_rejects_dur() -> None:
    state = make_state()
    state.max_duration = "3ep"
    assert state.max_duration == Time(3, "ep")
    state.max_duration = 2
    assert state.max_duration == Time(2, "ep")
    with pytest.raises(ValueError, match="max_duration"):
        state.max_duration = "0.5dur"
    with pytest.raises(ValueError, match="ep, ba, sp, tok"):
        state.max_duration = "3 fortnights"


# --- state_dict -------------------------------------------------------------------------------


def _trained_state() -> State:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer = Trainer(
        model, make_loader(3), "1ep", optimizers=opt, schedulers=sched, log_train_loss=False
    )
    trainer.fit_sync()
    return trainer.state


def test_state_dict_round_trip(tmp_path: Path) -> None:
    trained = _trained_state()
    path = tmp_path / "state.pt"
    torch.save(trained.state_dict(), path)

    torch.manual_seed(123)
    model = TinyModel()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # different weights than the trained model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    fresh = State(model=model, max_duration="1ep", optimizers=opt, schedulers=sched)
    fresh.load_state_dict(torch.load(path, weights_only=False))

    for (name, a), (_, b) in zip(
        trained.model.state_dict().items(), fresh.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert fresh.timestamp == trained.timestamp
    assert int(fresh.timer.batch) == 3
    assert int(fresh.timer.epoch) == 1
    assert sched.last_epoch == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    trained_opt = trained.optimizers[0].state_dict()["state"]
    fresh_opt = opt.state_dict()["state"]
    assert trained_opt.keys() == fresh_opt.keys()
    assert fresh_opt
    for key in trained_opt:
        assert torch.equal(trained_opt[key]["momentum_buffer"], fresh_opt[key]["momentum_buffer"])


def test_a_frame_replacement_copies_every_other_field() -> None:
    """``_Frame.replace`` is written out field by field: a new field must be copied too."""
    from trainbus.core.state import _empty_frame, _Frame

    frame = _empty_frame()
    for i, name in enumerate(_Frame.__slots__):
        object.__setattr__(frame, name, f"value {i}")
    for i, name in enumerate(_Frame.__slots__):
        new = frame.replace(name, "new")
        assert getattr(new, name) == "new"
        assert getattr(frame, name) == f"value {i}"  # the old frame is untouched
        others = {n: getattr(new, n) for n in _Frame.__slots__ if n != name}
        assert others == {n: getattr(frame, n) for n in _Frame.__slots__ if n != name}


# --- steps_per_epoch (Composer v0.6) ------------------------------------------------------------


def test_steps_per_epoch_is_the_loaders_length_until_set() -> None:
    state = make_state(train_dataloader=make_loader(5))
    assert state.steps_per_epoch == 5
    state.steps_per_epoch = 3
    assert state.steps_per_epoch == 3
    state.snapshot().steps_per_epoch = 2  # a handler's view sets the live state's
    assert state.steps_per_epoch == 2
    state.steps_per_epoch = None
    assert state.steps_per_epoch == 5
    assert make_state(train_dataloader=iter([1, 2])).steps_per_epoch is None  # no len()


def test_steps_per_epoch_over_the_loader_is_capped_with_a_warning() -> None:
    state = make_state(train_dataloader=make_loader(5))
    with pytest.warns(UserWarning, match=r"steps_per_epoch=9 is more than the 5 batches"):
        state.steps_per_epoch = 9
    assert state.steps_per_epoch == 5


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2"])
def test_steps_per_epoch_refuses_what_is_not_a_positive_int(bad: Any) -> None:
    state = make_state(train_dataloader=make_loader(5))
    with pytest.raises(ValueError, match=rf"steps_per_epoch={bad!r} must be a positive int"):
        state.steps_per_epoch = bad


def test_the_loop_trains_steps_per_epoch_batches_an_epoch() -> None:
    log = EventLog()
    trainer = make_trainer(n_batches=4, epochs=2, callbacks=[log])
    trainer.state.steps_per_epoch = 3
    trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 6 and int(trainer.state.timer.epoch) == 2
    ends = [batch for event, batch in log.events if event is Event.EPOCH_END]
    assert ends == [3, 6]


def test_a_handlers_view_refuses_the_training_loops_counting() -> None:
    """Issue 45: ``count_batch``/``count_epoch``/``begin_fit`` are the loop's interface;
    a handler calling them on its view would move the live run's counters."""
    state = State(model=torch.nn.Linear(1, 1), max_duration="1ep")
    state.count_batch(4)
    state.count_epoch()
    view = state.snapshot()
    for call in (lambda: view.count_batch(4), view.count_epoch, view.begin_fit):
        with pytest.raises(RuntimeError, match="the training loop's"):
            call()
    assert int(state.timer.batch) == 1 and int(state.timer.epoch) == 1
    state.stop_training()
    state.begin_fit()
    assert not state.stop_requested
