"""``trainbus.integrations.lightning`` under a real ``pytorch_lightning.Trainer`` (issue 33)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

import trainbus  # noqa: E402
from tests.integrations.helpers import (  # noqa: E402
    BATCH_SLEEP,
    BATCHES,
    EventLog,
    GradientsAtEvent,
    InlineUpload,
    TrailingUpload,
    Upload,
    metrics_service,
)
from trainbus.integrations.lightning import TrainbusCallback  # noqa: E402
from trainbus.loggers import InMemoryLogger  # noqa: E402

pytestmark = [
    pytest.mark.anyio,
    # Lightning 2.6 on torch 2.13 calls a deprecated torch._pytree check on every batch.
    pytest.mark.filterwarnings(
        r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"
    ),
    # Lightning suggests worker processes for the tiny in-memory loaders used here.
    pytest.mark.filterwarnings(r"ignore:The '\w+' does not have many workers"),
    # The fits without validation data skip Tiny's validation_step, as they should.
    pytest.mark.filterwarnings(r"ignore:You defined a `validation_step` but have no"),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Lightning runs on the training thread; the bus is tested on both


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, sleep: float = BATCH_SLEEP) -> None:
        super().__init__()
        self.sleep = sleep
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        time.sleep(self.sleep)  # stands for the rest of a real batch's compute
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(batches: int) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(8 * batches, 16, generator=g), torch.randint(0, 4, (8 * batches,), generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=8)


class LoopTime(pl.Callback):  # type: ignore[misc]
    """Lightning's training loop time (first batch to train end), the thread it ran on."""

    def __init__(self) -> None:
        self.started = 0.0
        self.elapsed = 0.0
        self.thread = ""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.started = time.perf_counter()
        self.thread = threading.current_thread().name

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.elapsed = time.perf_counter() - self.started


class InlinePost(pl.Callback):  # type: ignore[misc]
    def __init__(self, upload: InlineUpload) -> None:
        self.upload = upload

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.upload(trainer.global_step)


def trainer(callbacks: list[Any], max_epochs: int = 1, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
        **kwargs,
    }
    return pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, accelerator="cpu",
                      devices=1, **options)


async def test_an_async_upload_per_batch_overlaps_lightnings_loop() -> None:
    with metrics_service() as service:
        bare: list[float] = []
        overlapped: list[float] = []
        for _ in range(2):  # interleaved rounds
            timing = LoopTime()
            trainer([timing]).fit(Tiny(), loader(BATCHES))
            bare.append(timing.elapsed)
            timing = LoopTime()
            upload = Upload(service.url)
            bridge = TrainbusCallback(callbacks=[upload])
            await bridge.fit(trainer([bridge, timing]), Tiny(), loader(BATCHES))
            assert upload.sent == list(range(1, BATCHES + 1))
            assert timing.thread != threading.current_thread().name
            overlapped.append(timing.elapsed)
        timing = LoopTime()
        inline = InlineUpload(service.url)
        trainer([InlinePost(inline), timing]).fit(Tiny(), loader(BATCHES))
        inline.close()
        assert inline.sent == BATCHES
    print(f"bus {min(overlapped) / min(bare):.2f}x, inline {timing.elapsed / min(bare):.2f}x")
    assert timing.elapsed / min(bare) > 1.4, (timing.elapsed, bare)
    assert min(overlapped) / min(bare) < 1.3, (overlapped, bare)


class Handoff(Tiny):
    """Each training step first waits for the previous batch's trailing upload."""

    def __init__(self, upload: TrailingUpload) -> None:
        super().__init__(sleep=0.0)
        self.upload = upload

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.upload.step(batch_idx)
        return super().training_step(batch, batch_idx)


async def test_a_trailing_upload_is_handed_over_when_its_lightning_batch_ends() -> None:
    # The bridge publishes no BEFORE_FORWARD: batch k's upload is handed to the loop when
    # batch k ends, so the next step finds it done and no barrier waits (issue 47).
    with metrics_service() as service:
        upload = TrailingUpload(service.url, BATCHES)
        bridge = TrainbusCallback(callbacks=[upload])
        await bridge.fit(trainer([bridge]), Handoff(upload), loader(BATCHES))
    assert upload.handed_over == [True] * (BATCHES - 1)
    assert bridge.bus.statistics().barrier_waits == 0


async def test_mapping_gradients_and_lightning_metrics(tmp_path: Path) -> None:
    grads, memory, log = GradientsAtEvent(), InMemoryLogger(), EventLog()
    bridge = TrainbusCallback(callbacks=[grads, log], loggers=[memory])
    csv = pl.loggers.CSVLogger(tmp_path)  # Lightning's own logger keeps working beside it
    host = trainer([bridge], max_epochs=2, logger=csv)
    await bridge.fit(host, Tiny(sleep=0), loader(3), loader(2))
    # @blocking at AFTER_TRAIN_BATCH (on_before_optimizer_step): gradients present.
    assert grads.seen == [(b, True) for b in range(6)]
    # self.log(...) reached the trainbus logger, at the trainbus batch count.
    assert memory.get_timeseries("train_loss")["step"] == [1, 2, 3, 4, 5, 6]
    assert len(memory.get_timeseries("val_loss")["val_loss"]) == 2
    assert "train_loss" in (Path(csv.log_dir) / "metrics.csv").read_text()
    names = [e for e, _ in log.events]
    assert names[:3] == ["init", "fit_start", "epoch_start"]
    assert names[3:12] == [
        "after_dataloader", "batch_start", "before_train_batch", "after_loss",
        "before_backward", "after_backward", "after_train_batch", "batch_end",
        "batch_checkpoint",
    ]
    first_epoch = names[: names.index("epoch_checkpoint") + 1]
    assert first_epoch[-8:] == [  # Lightning validates before on_train_epoch_end
        "eval_batch_end", "eval_batch_start", "eval_before_forward", "eval_after_forward",
        "eval_batch_end", "eval_end", "epoch_end", "epoch_checkpoint",
    ]
    assert ("eval_start", 3) in log.events and ("epoch_end", 3) in log.events
    assert names[-1] == "fit_end" and names.count("batch_end") == 6
    state = bridge.bus.state
    assert state.model is not None and int(state.timer.epoch) == 2
    assert set(state.current_metrics["eval"]) >= {"val_loss"}
    assert bridge.bus.engine.closed


async def test_a_handler_error_stops_lightning_and_is_raised_from_fit() -> None:
    class Fails(trainbus.Callback):
        def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
            if int(state.timer.batch) == 2:
                raise RuntimeError("boom at batch 2")

    bridge = TrainbusCallback(callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        await bridge.fit(trainer([bridge]), Tiny(sleep=0), loader(6))
    assert int(bridge.bus.state.timer.batch) == 2 and bridge.bus.engine.closed


async def test_stop_training_stops_lightning() -> None:
    class Stopper(trainbus.Callback):
        def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
            if int(state.timer.batch) == 2:
                state.stop_training()

    bridge = TrainbusCallback(callbacks=[Stopper()])
    await bridge.fit(trainer([bridge], max_epochs=3), Tiny(sleep=0), loader(6))
    assert int(bridge.bus.state.timer.batch) == 2


async def test_cancelling_the_awaiting_task_stops_lightning_and_closes() -> None:
    class Closes(trainbus.Callback):
        closed = False

        def close(self, state: trainbus.State, logger: trainbus.Logger) -> None:
            Closes.closed = True

    bridge = TrainbusCallback(callbacks=[Closes()])
    with anyio.move_on_after(0.5):
        await bridge.fit(trainer([bridge], max_epochs=100), Tiny(sleep=0.01), loader(8))
    assert Closes.closed and 0 < int(bridge.bus.state.timer.batch) < 800


async def test_validate_outside_a_fit_publishes_nothing() -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    host = trainer([bridge])
    module = Tiny(sleep=0)
    await bridge.fit(host, module, loader(2))
    seen = len(log.events)
    host.validate(module, loader(2), verbose=False)  # on this loop's thread: no error
    assert len(log.events) == seen


def test_plain_trainer_fit_runs_each_events_handlers_in_turn() -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    trainer([bridge]).fit(Tiny(sleep=0), loader(2))
    assert [e for e, _ in log.events][-1] == "fit_end" and bridge.bus.engine.closed


def test_fit_sync_and_a_missing_callback() -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    bridge.fit_sync(trainer([bridge]), Tiny(sleep=0), loader(2), backend="trio")
    assert ("batch_end", 2) in log.events
    with pytest.raises(ValueError, match=r"not in trainer\.callbacks"):
        bridge.fit_sync(trainer([]), Tiny(sleep=0), loader(2))
