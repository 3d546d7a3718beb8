"""``trainbus.integrations.hf`` under a real ``transformers.Trainer`` (issue 33).

The model is a tiny ``PreTrainedModel`` built from its config: nothing is downloaded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

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
from trainbus.integrations.hf import TrainbusCallback  # noqa: E402
from trainbus.loggers import InMemoryLogger  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Trainer runs on the training thread; the bus is tested on both


class TinyConfig(transformers.PretrainedConfig):  # type: ignore[misc]
    model_type = "trainbus-tiny"

    def __init__(self, n_in: int = 16, n_out: int = 4, sleep: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.n_in, self.n_out, self.sleep = n_in, n_out, sleep


class TinyModel(transformers.PreTrainedModel):  # type: ignore[misc]
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = torch.nn.Sequential(torch.nn.Linear(config.n_in, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, config.n_out))
        self.post_init()

    #: Called at each training forward (a test's look at the bus from inside a step).
    on_forward: Any = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        if self.training and self.on_forward is not None:
            self.on_forward()
        logits = self.net(x)
        if self.training and self.config.sleep:
            time.sleep(self.config.sleep)  # stands for the rest of a real batch's compute
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class LoopTime(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.started = self.elapsed = 0.0
        self.thread = ""

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()
        self.thread = threading.current_thread().name

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.elapsed = time.perf_counter() - self.started


class InlinePost(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self, upload: InlineUpload) -> None:
        self.upload = upload

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.upload(state.global_step)


def hf_trainer(
    tmp_path: Path, callbacks: list[Any], *, batches: int = BATCHES, epochs: int = 1,
    sleep: float = BATCH_SLEEP, eval_batches: int = 0, **kwargs: Any,
) -> Any:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        num_train_epochs=epochs,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="epoch" if eval_batches else "no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        log_level="error",
        **kwargs,
    )
    return transformers.Trainer(
        model=TinyModel(TinyConfig(sleep=sleep)),
        args=args,
        train_dataset=Data(8 * batches),
        eval_dataset=Data(8 * eval_batches) if eval_batches else None,
        callbacks=callbacks,
    )


async def test_an_async_upload_per_batch_overlaps_the_hf_trainer(tmp_path: Path) -> None:
    with metrics_service() as service:
        bare: list[float] = []
        overlapped: list[float] = []
        for _ in range(2):  # interleaved rounds
            timing = LoopTime()
            hf_trainer(tmp_path, [timing]).train()
            bare.append(timing.elapsed)
            timing = LoopTime()
            upload = Upload(service.url)
            bridge = TrainbusCallback(callbacks=[upload])
            await bridge.train(hf_trainer(tmp_path, [bridge, timing]))
            assert upload.sent == list(range(1, BATCHES + 1))
            assert timing.thread != threading.current_thread().name
            overlapped.append(timing.elapsed)
        timing = LoopTime()
        inline = InlineUpload(service.url)
        hf_trainer(tmp_path, [InlinePost(inline), timing]).train()
        inline.close()
        assert inline.sent == BATCHES
    print(f"bus {min(overlapped) / min(bare):.2f}x, inline {timing.elapsed / min(bare):.2f}x")
    assert timing.elapsed / min(bare) > 1.4, (timing.elapsed, bare)
    assert min(overlapped) / min(bare) < 1.3, (overlapped, bare)


async def test_a_trailing_upload_is_handed_over_when_its_hf_step_ends(tmp_path: Path) -> None:
    # The bridge publishes no BEFORE_FORWARD: step k's upload is handed to the loop when
    # step k ends, so the next forward finds it done and no barrier waits (issue 47).
    with metrics_service() as service:
        upload = TrailingUpload(service.url, BATCHES)
        bridge = TrainbusCallback(callbacks=[upload])
        hf = hf_trainer(tmp_path, [bridge], sleep=0.0)
        forwards = [0]

        def forward() -> None:
            upload.step(forwards[0])
            forwards[0] += 1

        hf.model.on_forward = forward
        await bridge.train(hf)
    assert upload.handed_over == [True] * (BATCHES - 1)
    assert bridge.bus.statistics().barrier_waits == 0


async def test_mapping_gradients_and_hf_logs(tmp_path: Path) -> None:
    grads, memory, log = GradientsAtEvent(), InMemoryLogger(), EventLog()
    bridge = TrainbusCallback(callbacks=[grads, log], loggers=[memory])
    host = hf_trainer(tmp_path, [bridge], batches=3, epochs=2, sleep=0, eval_batches=2,
                      max_grad_norm=1.0)
    output = await bridge.train(host)
    assert output.global_step == 6
    # @blocking at AFTER_TRAIN_BATCH (on_pre_optimizer_step): clipped gradients present.
    assert grads.seen == [(b, True) for b in range(6)]
    # on_log's logs are records, at the trainbus batch count (== HF's global_step).
    assert memory.get_timeseries("loss")["step"] == [1, 2, 3, 4, 5, 6]
    assert memory.get_timeseries("grad_norm")["step"] == [1, 2, 3, 4, 5, 6]
    assert memory.get_timeseries("eval_loss")["step"] == [3, 6]
    assert "train_runtime" in memory.most_recent_values
    names = [e for e, _ in log.events]
    assert names[:9] == [
        "init", "fit_start", "epoch_start", "after_dataloader", "batch_start",
        "before_train_batch", "after_backward", "after_train_batch", "batch_end",
    ]
    first_epoch = names[: names.index("eval_end") + 1]
    assert first_epoch[-9:] == [  # HF evaluates after on_epoch_end
        "batch_checkpoint", "epoch_end", "epoch_checkpoint", "eval_start",
        "eval_after_forward", "eval_batch_end", "eval_after_forward", "eval_batch_end",
        "eval_end",
    ]
    assert names[-1] == "fit_end" and names.count("batch_end") == 6
    state = bridge.bus.state
    assert isinstance(state.model, TinyModel) and int(state.timer.epoch) == 2
    assert "eval_loss" in state.current_metrics["eval"]
    assert int(state.max_duration.value) == 6 and bridge.bus.engine.closed


async def test_gradient_accumulation_publishes_a_backward_per_microbatch(tmp_path: Path) -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    await bridge.train(hf_trainer(tmp_path, [bridge], batches=4, sleep=0,
                                  gradient_accumulation_steps=2))
    names = [e for e, _ in log.events]
    assert names.count("batch_end") == 2 and names.count("after_backward") == 4
    assert bridge.bus.state.batch_num_samples == 16


async def test_a_handler_error_stops_the_hf_trainer(tmp_path: Path) -> None:
    class Fails(trainbus.Callback):
        def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
            if int(state.timer.batch) == 2:
                raise RuntimeError("boom at batch 2")

    bridge = TrainbusCallback(callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        await bridge.train(hf_trainer(tmp_path, [bridge], batches=6, sleep=0))
    assert int(bridge.bus.state.timer.batch) == 2 and bridge.bus.engine.closed


async def test_stop_training_stops_the_hf_trainer(tmp_path: Path) -> None:
    class Stopper(trainbus.Callback):
        def batch_end(self, state: trainbus.State, logger: trainbus.Logger) -> None:
            if int(state.timer.batch) == 2:
                state.stop_training()

    bridge = TrainbusCallback(callbacks=[Stopper()])
    output = await bridge.train(hf_trainer(tmp_path, [bridge], batches=6, sleep=0))
    assert output.global_step == 2


def test_plain_train_and_train_sync(tmp_path: Path) -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    hf_trainer(tmp_path, [bridge], batches=2, sleep=0).train()
    assert log.events[-1] == ("fit_end", 2) and bridge.bus.engine.closed
    bridge.train_sync(hf_trainer(tmp_path, [bridge], batches=2, sleep=0), backend="trio")
    assert log.events[-1] == ("fit_end", 4)
    with pytest.raises(ValueError, match="not among the trainer's callbacks"):
        bridge.train_sync(hf_trainer(tmp_path, [], batches=2, sleep=0))


async def test_evaluate_outside_train_publishes_nothing(tmp_path: Path) -> None:
    log = EventLog()
    bridge = TrainbusCallback(callbacks=[log])
    host = hf_trainer(tmp_path, [bridge], batches=2, sleep=0, eval_batches=2)
    await bridge.train(host)
    seen = len(log.events)
    assert "eval_loss" in host.evaluate()  # on this loop's thread: no bus, no error
    assert len(log.events) == seen
