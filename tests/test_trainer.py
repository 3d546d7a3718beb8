"""The Trainer's behaviour: event order and timer values, gradient accumulation, eval
intervals, durations, stopping, continued fits, losses, metrics, precision, threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import trainbus
from tests.helpers import EventLog, TinyModel, make_loader, make_trainer
from trainbus import Callback, Event, Trainer, blocking
from trainbus.loggers import InMemoryLogger

E = Event
MICRO = [
    E.BEFORE_FORWARD, E.AFTER_FORWARD, E.BEFORE_LOSS, E.AFTER_LOSS,
    E.BEFORE_BACKWARD, E.AFTER_BACKWARD,
]  # fmt: skip


class Recorder(Callback):
    """Records ``(event, epoch, batch, batch_in_epoch)`` and close/post_close in ``calls``."""

    def __init__(self, calls: list[Any] | None = None, name: str = "rec") -> None:
        self.calls: list[Any] = calls if calls is not None else []
        self.name = name
        self.rows: list[tuple[str, int, int, int]] = []

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        t = state.timer
        self.rows.append((event.value, int(t.epoch), int(t.batch), int(t.batch_in_epoch)))

    def close(self, state: Any, logger: Any) -> None:
        self.calls.append(("close", self.name))

    def post_close(self) -> None:
        self.calls.append(("post_close", self.name))

    def count(self, event: Event) -> int:
        return sum(1 for row in self.rows if row[0] == event.value)


def _batch(epoch: int, before: int) -> list[tuple[str, int, int, int]]:
    """One batch's rows: counters ``before`` until they advance just before BATCH_END."""
    in_epoch = before - 2 * epoch
    rows = [(e.value, epoch, before, in_epoch) for e in (
        E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH, *MICRO, E.AFTER_TRAIN_BATCH,
    )]  # fmt: skip
    after = (epoch, before + 1, in_epoch + 1)
    rows += [(E.BATCH_END.value, *after), (E.BATCH_CHECKPOINT.value, *after)]
    return rows


def _epoch_tail(epochs_done: int, batch: int) -> list[tuple[str, int, int, int]]:
    return [(e.value, epochs_done, batch, 0) for e in (
        E.EPOCH_END, E.EVAL_START, E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD,
        E.EVAL_AFTER_FORWARD, E.EVAL_BATCH_END, E.EVAL_END, E.EPOCH_CHECKPOINT,
    )]  # fmt: skip


# SPEC section 2, spelled out: 2 epochs x 2 batches, eval at each epoch end.
SPEC_ORDER = [
    ("init", 0, 0, 0),
    ("fit_start", 0, 0, 0),
    ("epoch_start", 0, 0, 0),
    *_batch(0, 0),  # BATCH_END: timer.batch == 1
    *_batch(0, 1),  # BATCH_END: timer.batch == 2
    *_epoch_tail(1, 2),  # EPOCH_END: timer.epoch == 1
    ("epoch_start", 1, 2, 0),
    *_batch(1, 2),
    *_batch(1, 3),
    *_epoch_tail(2, 4),
    ("fit_end", 2, 4, 0),
]


def test_event_order_and_timer_values_match_the_spec() -> None:
    calls: list[Any] = []
    first, second = Recorder(calls, "first"), Recorder(calls, "second")
    trainer = make_trainer(2, 2, [first, second], eval_batches=1, device="cpu")
    trainer.fit_sync()
    assert first.rows == SPEC_ORDER
    assert second.rows == SPEC_ORDER
    # spot checks of the table itself, as the SPEC words them
    assert first.rows[13] == ("batch_end", 0, 1, 1)
    assert first.rows.index(("epoch_end", 1, 2, 0)) == 27
    assert sorted(calls[:2]) == [("close", "first"), ("close", "second")]
    assert sorted(calls[2:]) == [("post_close", "first"), ("post_close", "second")]


# -- gradient accumulation --------------------------------------------------------------


@pytest.mark.parametrize("grad_accum", [2, 3])
def test_grad_accum_repeats_the_microbatch_events_inside_one_train_batch(
    grad_accum: int,
) -> None:
    log = EventLog()
    model = TinyModel()
    trainer = Trainer(
        model, make_loader(2, batch_size=6), "1ep", callbacks=[log], grad_accum=grad_accum,
        device="cpu",
    )  # fmt: skip
    trainer.fit_sync()
    names = log.names
    starts = [i for i, e in enumerate(names) if e is E.BEFORE_TRAIN_BATCH]
    ends = [i for i, e in enumerate(names) if e is E.AFTER_TRAIN_BATCH]
    assert len(starts) == len(ends) == 2
    for start, end in zip(starts, ends, strict=True):
        assert names[start + 1 : end] == MICRO * grad_accum
    assert names.count(E.AFTER_FORWARD) == 2 * grad_accum
    assert model.training_forwards == 2 * grad_accum
    assert names.count(E.BATCH_END) == 2


class GradCapture(Callback):
    """Copies every parameter's gradient after each backward, on the training thread."""

    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor]] = []

    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        self.grads.append([p.grad.detach().clone() for p in state.model.parameters()])


def _train_with(grad_accum: int, batch_size: int) -> tuple[list[list[torch.Tensor]], TinyModel]:
    model = TinyModel()
    capture = GradCapture()
    trainer = Trainer(
        model,
        make_loader(3, batch_size=batch_size),
        "1ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.5),
        callbacks=[capture],
        grad_accum=grad_accum,
        device="cpu",
    )
    trainer.fit_sync()
    return capture.grads, model


@pytest.mark.parametrize(("grad_accum", "batch_size"), [(2, 6), (3, 6), (3, 4)])
def test_grad_accum_gives_the_gradients_of_one_microbatch(grad_accum: int, batch_size: int) -> None:
    whole, whole_model = _train_with(1, batch_size)
    accum, accum_model = _train_with(grad_accum, batch_size)
    n_micro = len(accum) // 3  # 4 rows in 3 chunks give 2 microbatches of 2
    assert len(whole) == 3
    assert n_micro == len(torch.chunk(torch.empty(batch_size), grad_accum))
    for b in range(3):
        summed = accum[(b + 1) * n_micro - 1]  # the last backward of batch b: all summed
        for g_whole, g_accum in zip(whole[b], summed, strict=True):
            torch.testing.assert_close(g_accum, g_whole, rtol=1e-5, atol=1e-6)
        partial = accum[b * n_micro]  # after the first microbatch only: not the whole
        assert not torch.allclose(partial[0], whole[b][0])
    for p_whole, p_accum in zip(whole_model.parameters(), accum_model.parameters(), strict=True):
        torch.testing.assert_close(p_accum, p_whole, rtol=1e-5, atol=1e-6)


# -- evaluation --------------------------------------------------------------------------


def _eval_points(rec: Recorder) -> list[tuple[str, int, int]]:
    """For each EVAL_START: the event before it and the (epoch, batch) counters."""
    return [
        (rec.rows[i - 1][0], row[1], row[2])
        for i, row in enumerate(rec.rows)
        if row[0] == "eval_start"
    ]


@pytest.mark.parametrize(
    ("interval", "n_batches", "epochs", "expected"),
    [
        ("2ba", 4, 1, [("batch_end", 0, 2), ("batch_end", 0, 4)]),  # BATCH_CHECKPOINT after
        ("3ba", 2, 2, [("batch_end", 1, 3)]),
        ("1ep", 2, 2, [("epoch_end", 1, 2), ("epoch_end", 2, 4)]),
        ("2ep", 1, 4, [("epoch_end", 2, 2), ("epoch_end", 4, 4)]),
        (2, 1, 4, [("epoch_end", 2, 2), ("epoch_end", 4, 4)]),
        (trainbus.Time(3, trainbus.TimeUnit.EPOCH), 1, 4, [("epoch_end", 3, 3)]),
    ],
)
def test_eval_interval(interval: Any, n_batches: int, epochs: int, expected: list[Any]) -> None:
    rec = Recorder()
    trainer = make_trainer(n_batches, epochs, [rec], eval_batches=2, eval_interval=interval)
    trainer.fit_sync()
    assert _eval_points(rec) == expected
    assert rec.count(E.EVAL_BATCH_START) == 2 * len(expected)
    assert rec.count(E.EVAL_END) == len(expected)


def test_no_eval_without_an_eval_dataloader() -> None:
    rec = Recorder()
    make_trainer(2, 2, [rec], eval_interval="1ba").fit_sync()
    assert not any(row[0].startswith("eval") for row in rec.rows)


class Accuracy(TinyModel):
    """Reports accuracy through the ``eval_metrics(outputs, batch)`` hook."""

    def eval_metrics(self, outputs: torch.Tensor, batch: Any) -> dict[str, torch.Tensor]:
        return {"accuracy": (outputs.argmax(dim=1) == batch[1]).float().mean()}


class EvalEndMetrics(Callback):
    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    async def eval_end(self, state: Any, logger: Any) -> None:
        self.seen.append({k: float(v) for k, v in state.current_metrics["eval"].items()})


def test_eval_computes_mean_loss_and_model_metrics() -> None:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(7, 4, generator=g), torch.randint(0, 3, (7,), generator=g)
    eval_loader = DataLoader(TensorDataset(x, y), batch_size=3)  # batches of 3, 3, 1
    model, seen, memory = Accuracy(), EvalEndMetrics(), InMemoryLogger()
    trainer = Trainer(
        model, make_loader(3), "1ep", eval_dataloader=eval_loader, callbacks=[seen],
        loggers=[memory], device="cpu",
    )  # fmt: skip
    trainer.fit_sync()
    model.eval()
    with torch.no_grad():
        out = model((x, y))  # eval ran after the last step: same parameters
    expected = {
        "loss": F.cross_entropy(out, y).item(),
        "accuracy": (out.argmax(1) == y).float().mean().item(),
    }
    assert len(seen.seen) == 1
    assert seen.seen[0] == pytest.approx(expected, rel=1e-5)
    assert memory.most_recent_values["eval/loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert memory.most_recent_values["eval/accuracy"] == pytest.approx(
        expected["accuracy"], rel=1e-5
    )
    assert memory.get_timeseries("eval/accuracy")["epoch"] == [1]


# -- durations, continued fits, stopping -------------------------------------------------


def test_max_duration_in_batches_stops_mid_epoch_and_a_continued_fit_resumes() -> None:
    rec, model = Recorder(), TinyModel()
    trainer = make_trainer(4, model=model, callbacks=[rec], max_duration="6ba")
    trainer.fit_sync()
    ts = trainer.state.timestamp
    assert (int(ts.epoch), int(ts.batch), int(ts.batch_in_epoch)) == (1, 6, 2)
    assert rec.count(E.BATCH_END) == 6
    assert rec.count(E.EPOCH_END) == 1  # the second epoch did not end
    assert rec.rows[-2][0] == "batch_checkpoint"
    assert rec.rows[-1] == ("fit_end", 1, 6, 2)
    assert model.training_forwards == 6

    rec.rows.clear()
    trainer.fit_sync(duration="2ba")  # the rest of the epoch: it ends this time
    assert [r[0] for r in rec.rows].count("epoch_start") == 0
    assert rec.count(E.BATCH_END) == 2
    assert rec.rows[-3:] == [
        ("epoch_end", 2, 8, 0), ("epoch_checkpoint", 2, 8, 0), ("fit_end", 2, 8, 0),
    ]  # fmt: skip
    assert model.training_forwards == 8


def test_max_duration_in_batches_at_the_end_of_the_data_ends_the_epoch() -> None:
    rec = Recorder()
    make_trainer(2, callbacks=[rec], max_duration="2ba", eval_batches=1).fit_sync()
    assert [r[0] for r in rec.rows[-10:]] == [
        "batch_checkpoint", "epoch_end", "eval_start", "eval_batch_start",
        "eval_before_forward", "eval_after_forward", "eval_batch_end", "eval_end",
        "epoch_checkpoint", "fit_end",
    ]  # fmt: skip
    assert rec.rows[-1] == ("fit_end", 1, 2, 0)


def test_max_duration_in_samples() -> None:
    rec = Recorder()
    make_trainer(4, callbacks=[rec], max_duration="12sp").fit_sync()  # 4 samples a batch
    assert rec.count(E.BATCH_END) == 3


def test_fit_with_duration_continues_a_finished_run() -> None:
    calls: list[Any] = []
    rec, model = Recorder(calls), TinyModel()
    trainer = make_trainer(2, 1, [rec], model=model)
    trainer.fit_sync()
    assert rec.rows[-1] == ("fit_end", 1, 2, 0)
    trainer.fit_sync(duration="1ep")
    assert rec.count(E.INIT) == 1
    assert rec.count(E.FIT_START) == rec.count(E.FIT_END) == 2
    assert rec.count(E.EPOCH_START) == 2
    assert rec.count(E.BATCH_END) == 4
    assert [r for r in rec.rows if r[0] == "batch_end"][2:] == [
        ("batch_end", 1, 3, 1), ("batch_end", 1, 4, 2),
    ]  # fmt: skip
    assert rec.rows[-1] == ("fit_end", 2, 4, 0)
    assert calls == [("close", "rec"), ("post_close", "rec")] * 2
    assert model.training_forwards == 4
    assert trainer.state.max_duration == trainbus.Time(2, trainbus.TimeUnit.EPOCH)


def test_a_second_fit_of_a_finished_run_names_duration_instead_of_training_nothing() -> None:
    """Regression: a second ``fit_sync()`` after a finished run ran an empty cycle and
    said nothing."""
    rec = Recorder()
    trainer = make_trainer(2, 1, [rec])
    trainer.fit_sync()
    with pytest.raises(RuntimeError, match=r"max_duration='1ep'.*duration='1ep'"):
        trainer.fit_sync()
    with pytest.raises(RuntimeError, match="pass duration="):
        anyio.run(trainer.fit)
    assert rec.count(E.FIT_START) == 1  # no cycle ran: no event, no close
    trainer.fit_sync(duration="1ep")  # what the message says works
    assert rec.count(E.BATCH_END) == 4


def test_a_run_stopped_early_continues_with_a_plain_fit() -> None:
    """Only a run that reached max_duration refuses: one stopped early has batches left."""

    class StopAtTwo(trainbus.Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 2:
                state.stop_training()

    rec = Recorder()
    trainer = make_trainer(4, 1, [rec, StopAtTwo()])
    trainer.fit_sync()
    assert rec.count(E.BATCH_END) == 2
    trainer.fit_sync()
    assert rec.count(E.BATCH_END) == 4


def test_fit_with_a_bad_duration_names_the_argument() -> None:
    trainer = make_trainer(2)
    with pytest.raises(ValueError, match="duration"):
        trainer.fit_sync(duration="1parsec")
    with pytest.raises(ValueError, match=r"duration='0\.5dur'"):
        trainer.fit_sync(duration="0.5dur")


class StopAt(Callback):
    """Calls ``state.stop_training()`` from one handler when ``timer.batch`` == ``at``."""

    def __init__(self, at: int, kind: str) -> None:
        self.at = at
        self.kind = kind

    def _maybe_stop(self, state: Any) -> None:
        if int(state.timer.batch) == self.at:
            state.stop_training()


class AsyncStopAtBatchEnd(StopAt):
    async def batch_end(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self._maybe_stop(state)


class SyncStopAtBatchEnd(StopAt):
    def batch_end(self, state: Any, logger: Any) -> None:
        self._maybe_stop(state)


class AsyncStopAtAfterLoss(StopAt):
    async def after_loss(self, state: Any, logger: Any) -> None:
        await anyio.sleep(0)
        self._maybe_stop(state)  # counters: batch 2 is batch 3's AFTER_LOSS


@pytest.mark.parametrize(
    ("cls", "at"),
    [(AsyncStopAtBatchEnd, 3), (SyncStopAtBatchEnd, 3), (AsyncStopAtAfterLoss, 2)],
)
def test_stop_training_from_a_handler_stops_at_the_next_batch_boundary(
    cls: type[StopAt], at: int
) -> None:
    rec, model = Recorder(), TinyModel()
    trainer = make_trainer(5, 2, [cls(at, "x"), rec], model=model)
    trainer.fit_sync()
    assert rec.count(E.BATCH_END) == 3
    assert model.training_forwards == 3
    assert rec.count(E.EPOCH_END) == 0
    assert rec.rows[-1] == ("fit_end", 0, 3, 3)
    # the request belongs to that fit(): the next one trains again
    trainer.fit_sync(duration="1ba")
    assert rec.count(E.BATCH_END) == 4


# -- fit() while fitting ------------------------------------------------------------------


class Gate(Callback):
    """Holds training at the first BATCH_END until released."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def batch_end(self, state: Any, logger: Any) -> None:
        self.entered.set()
        await self.release.wait()


@pytest.mark.anyio
async def test_fit_while_fitting_raises_fit_in_progress() -> None:
    gate, rec = Gate(), Recorder()
    trainer = make_trainer(2, 1, [gate, rec])
    async with anyio.create_task_group() as tg:
        tg.start_soon(trainer.fit)
        await gate.entered.wait()
        with pytest.raises(trainbus.FitInProgressError, match=r"already fitting.*await"):
            await trainer.fit()
        with pytest.raises(trainbus.FitInProgressError):
            await trainer.fit(duration="1ep")
        gate.release.set()
    assert rec.count(E.FIT_START) == 1
    assert rec.count(E.BATCH_END) == 2
    assert trainer.state.max_duration == trainbus.Time(1, trainbus.TimeUnit.EPOCH)


# -- losses, optimizers, precision, threads, logging ---------------------------------------


def test_model_without_loss_uses_loss_fn_with_inputs_and_targets() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(outputs.shape), targets.dtype))
        return F.cross_entropy(outputs, targets)

    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model, make_loader(3), "1ep", eval_dataloader=make_loader(2, seed=1), loss_fn=loss_fn,
        device="cpu",
    )  # fmt: skip
    trainer.fit_sync()
    assert seen == [((4, 3), torch.int64)] * 5  # 3 training batches, 2 eval batches
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_default_optimizer_is_adamw_with_lr_1e_3() -> None:
    model = TinyModel()
    trainer = Trainer(model, make_loader(2), "1ep", device="cpu")
    (opt,) = trainer.state.optimizers
    assert type(opt) is torch.optim.AdamW
    assert opt.param_groups[0]["lr"] == 1e-3
    assert {id(p) for p in opt.param_groups[0]["params"]} == {id(p) for p in model.parameters()}
    before = model.lin.weight.detach().clone()
    trainer.fit_sync()
    assert opt.state  # it stepped
    assert not torch.equal(before, model.lin.weight)


class OutputDtype(Callback):
    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []

    def after_forward(self, state: Any, logger: Any) -> None:
        self.dtypes.append(state.outputs.dtype)


def test_bf16_precision_runs_on_cpu_under_autocast() -> None:
    dtypes, memory = OutputDtype(), InMemoryLogger()
    trainer = make_trainer(3, 1, [dtypes], precision="bf16", loggers=[memory], device="cpu")
    trainer.fit_sync()
    assert dtypes.dtypes == [torch.bfloat16] * 3
    losses = memory.get_timeseries("loss/train")["loss/train"]
    assert len(losses) == 3
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.anyio
async def test_training_runs_off_the_event_loop_thread() -> None:
    model = TinyModel()
    trainer = make_trainer(3, 1, model=model, eval_batches=1)
    await trainer.fit()
    assert model.forward_threads
    assert threading.get_ident() not in model.forward_threads


class LossAtAfterLoss(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_loss(self, state: Any, logger: Any) -> None:
        self.losses.append(state.loss.item())


def test_loss_train_is_logged_once_per_batch_at_its_step() -> None:
    memory, losses = InMemoryLogger(), LossAtAfterLoss()
    make_trainer(3, 1, [losses], loggers=[memory]).fit_sync()
    series = memory.get_timeseries("loss/train")
    assert series["step"] == [1, 2, 3]
    assert series["batch"] == [1, 2, 3]
    assert series["loss/train"] == pytest.approx(losses.losses)


def test_loss_train_with_grad_accum_is_the_mean_over_the_batch() -> None:
    memory, losses = InMemoryLogger(), LossAtAfterLoss()
    make_trainer(1, 1, [losses], loggers=[memory], grad_accum=2).fit_sync()  # 2 + 2 samples
    assert memory.get_timeseries("loss/train")["loss/train"] == pytest.approx(
        [sum(losses.losses) / 2]
    )


def test_log_train_loss_false_logs_nothing() -> None:
    memory = InMemoryLogger()
    make_trainer(2, 1, loggers=[memory], log_train_loss=False).fit_sync()
    assert "loss/train" not in memory.data


# --- Composer's order around batch-wise evaluation (issue 31) ----------------------------------


def test_batch_checkpoint_fires_after_batch_end_and_the_batch_wise_evaluation() -> None:
    rec = Recorder()
    make_trainer(n_batches=2, callbacks=[rec], eval_batches=1, eval_interval="2ba").fit_sync()
    names = [row[0] for row in rec.rows]
    second = [i for i, name in enumerate(names) if name == "batch_end"][1]
    assert names[second : second + 8] == [e.value for e in (
        E.BATCH_END, E.EVAL_START, E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD,
        E.EVAL_AFTER_FORWARD, E.EVAL_BATCH_END, E.EVAL_END, E.BATCH_CHECKPOINT,
    )]  # fmt: skip
    first = names.index("batch_end")  # no evaluation due: BATCH_CHECKPOINT right after
    assert names[first : first + 2] == ["batch_end", "batch_checkpoint"]


# --- fit() called the Composer way (issue 31) -------------------------------------------------


def test_fit_called_without_await_warns_at_once_naming_the_line() -> None:
    log = EventLog()
    trainer = make_trainer(callbacks=[log])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()  # Composer v0.6's call, as a statement: nothing awaits it
        at_once, next_line = list(caught), sys._getframe().f_lineno
    assert [w.category for w in at_once] == [trainbus.FitNotAwaitedWarning]
    warning = at_once[0]
    assert (warning.filename, warning.lineno) == (__file__, next_line - 1)  # the fit() line
    message = str(warning.message)
    assert "use `await trainer.fit()`" in message and "`trainer.fit_sync()`" in message
    assert issubclass(trainbus.FitNotAwaitedWarning, RuntimeWarning)
    assert [event for event, _ in log.events] == [Event.INIT]  # nothing was trained


@pytest.mark.anyio
async def test_the_awaited_fit_call_trains_as_before() -> None:
    trainer = make_trainer(n_batches=2)
    call = trainer.fit()
    assert "not awaited" in repr(call)
    await call
    assert int(trainer.state.timer.batch) == 2
    async with anyio.create_task_group() as tg:  # start_soon takes it as a coroutine
        tg.start_soon(lambda: trainer.fit(duration="1ba"))
    assert int(trainer.state.timer.batch) == 3
    closed = trainer.fit(duration="1ba")
    closed.close()  # closing it on purpose: no warning, nothing trained
    del closed
    assert int(trainer.state.timer.batch) == 3


def test_a_fit_call_kept_but_never_awaited_warns_at_interpreter_exit(tmp_path: Any) -> None:
    script = tmp_path / "composer_way.py"
    script.write_text(
        "from tests.helpers import make_trainer\n"
        "trainer = make_trainer()\n"
        "kept = trainer.fit()\n"
        "print('trained', int(trainer.state.timer.batch))\n",
        encoding="utf-8",
    )
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        cwd=root, env={**os.environ, "PYTHONPATH": root},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained 0\n"
    assert f"{script}:3: FitNotAwaitedWarning: trainer.fit() was never awaited" in done.stderr
