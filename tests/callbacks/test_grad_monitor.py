"""GradMonitor: gradient norms read in lockstep at AFTER_TRAIN_BATCH (complete, unscaled,
clipped, before the step), logged per batch as tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_trainer
from trainbus import Callback, Logger, State, Time, blocking
from trainbus.callbacks import GradMonitor
from trainbus.core.callback import resolve_callback
from trainbus.loggers import InMemoryLogger


class ReferenceNorms(Callback):
    """Computes the norms independently, at the same point, after GradMonitor."""

    def __init__(self) -> None:
        self.latest: dict[str, float] = {}
        self.per_batch: list[dict[str, float]] = []

    @blocking
    def after_train_batch(self, state: State, logger: Logger) -> None:
        grads = {n: p.grad for n, p in state.model.named_parameters() if p.grad is not None}
        total = sum(float((g.double() ** 2).sum()) for g in grads.values()) ** 0.5
        self.latest = {"total": total, **{n: float(g.double().norm()) for n, g in grads.items()}}

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        self.per_batch.append(self.latest)


def values(logs: InMemoryLogger, name: str) -> list[float]:
    return list(logs.get_timeseries(name)[name])


def test_total_and_layer_norms_match_an_independent_computation() -> None:
    ref = ReferenceNorms()
    logs = InMemoryLogger()
    make_trainer(4, 2, [GradMonitor(log_layer_grad_norms=True), ref], loggers=[logs]).fit_sync()
    assert len(ref.per_batch) == 8
    assert values(logs, "grad_l2_norm/step") == pytest.approx([r["total"] for r in ref.per_batch])
    for name in ("lin.weight", "lin.bias"):
        got = values(logs, f"layer_grad_l2_norm/{name}")
        assert got == pytest.approx([r[name] for r in ref.per_batch])
    assert logs.get_timeseries("grad_l2_norm/step")["step"] == list(range(1, 9))
    assert all(v > 0 for v in values(logs, "grad_l2_norm/step"))


def test_layer_norms_are_off_by_default() -> None:
    logs = InMemoryLogger()
    make_trainer(2, 1, [GradMonitor()], loggers=[logs]).fit_sync()
    assert not [k for k in logs.data if k.startswith("layer_grad_l2_norm/")]
    assert len(values(logs, "grad_l2_norm/step")) == 2


def test_with_grad_accumulation_one_value_per_batch_of_the_accumulated_gradient() -> None:
    ref = ReferenceNorms()
    logs = InMemoryLogger()
    make_trainer(3, 1, [GradMonitor(), ref], loggers=[logs], grad_accum=2).fit_sync()
    assert logs.get_timeseries("grad_l2_norm/step")["step"] == [1, 2, 3]
    assert values(logs, "grad_l2_norm/step") == pytest.approx([r["total"] for r in ref.per_batch])


def test_norms_are_of_the_unscaled_and_clipped_gradients_under_fp16() -> None:
    ref = ReferenceNorms()
    logs = InMemoryLogger()
    make_trainer(3, 1, [GradMonitor(), ref], loggers=[logs], precision="fp16",
                 grad_clip_norm=0.05, device="cpu").fit_sync()  # fmt: skip
    got = values(logs, "grad_l2_norm/step")
    assert got == pytest.approx([r["total"] for r in ref.per_batch])
    assert got == pytest.approx([0.05] * 3, rel=1e-3)  # scaled, they would be ~65536 x larger


def test_parameters_without_gradients_are_skipped() -> None:
    model = TinyModel()
    model.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    logs = InMemoryLogger()
    make_trainer(2, 1, [GradMonitor(log_layer_grad_norms=True)], model=model,
                 loggers=[logs]).fit_sync()  # fmt: skip
    layers = sorted(k for k in logs.data if k.startswith("layer_grad_l2_norm/"))
    assert layers == ["layer_grad_l2_norm/lin.bias", "layer_grad_l2_norm/lin.weight"]


class RecordingLogger(Logger):
    """A real Logger that also keeps the raw values handed to log_metrics."""

    def __init__(self, state: State) -> None:
        super().__init__(state)
        self.raw: list[dict[str, Any]] = []

    def log_metrics(self, metrics: Any, step: int | None = None, **kw: Any) -> None:
        self.raw.append(dict(metrics))
        super().log_metrics(metrics, step, **kw)


def test_norms_are_handed_to_the_logger_as_tensors_never_read_on_the_host() -> None:
    model = TinyModel()
    state = State(model=model, max_duration=Time(1, "ba"))
    model((torch.randn(4, 4), None)).sum().backward()
    logger = RecordingLogger(state)
    monitor = GradMonitor(log_layer_grad_norms=True)
    monitor.after_train_batch(state, logger)
    assert logger.raw == []  # nothing logged before the batch ends
    monitor.batch_end(state, logger)
    (logged,) = logger.raw
    assert set(logged) == {
        "grad_l2_norm/step", "layer_grad_l2_norm/lin.weight", "layer_grad_l2_norm/lin.bias",
    }  # fmt: skip
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in logged.values())
    assert float(logged["grad_l2_norm/step"]) == pytest.approx(
        float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())  # type: ignore[union-attr]
    )


def test_a_model_without_gradients_logs_nothing() -> None:
    state = State(model=TinyModel(), max_duration=Time(1, "ba"))
    logger = RecordingLogger(state)
    monitor = GradMonitor()
    monitor.after_train_batch(state, logger)
    monitor.batch_end(state, logger)
    assert logger.raw == []


def test_after_train_batch_is_blocking_and_plain_so_it_runs_before_the_step() -> None:
    table = resolve_callback(GradMonitor())
    assert all(h.is_blocking and not h.is_async for h in table.handlers.values())
    assert {e.value for e in table.handlers} == {"after_train_batch", "batch_end"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_norms_are_logged_without_a_host_sync() -> None:  # pragma: no cover - GPU
    model = TinyModel().cuda()
    state = State(model=model, max_duration=Time(1, "ba"), device="cuda")
    model((torch.randn(4, 4, device="cuda"), None)).sum().backward()
    logger = RecordingLogger(state)
    monitor = GradMonitor(log_layer_grad_norms=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        monitor.after_train_batch(state, logger)
        monitor.batch_end(state, logger)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    (logged,) = logger.raw
    assert all(v.device.type == "cuda" for v in logged.values())
