"""LRMonitor: every param group's learning rate after the scheduler stepped, per batch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Trainer
from trainbus.callbacks import LRMonitor
from trainbus.core.callback import resolve_callback
from trainbus.loggers import InMemoryLogger


def test_logs_the_rate_after_each_scheduler_step_at_the_batch_step() -> None:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    logs = InMemoryLogger()
    Trainer(model, make_loader(3), "1ep", optimizers=opt, schedulers=sched,
            callbacks=[LRMonitor()], loggers=[logs]).fit_sync()  # fmt: skip
    ts = logs.get_timeseries("lr-SGD/group0")
    assert ts["lr-SGD/group0"] == pytest.approx([0.05, 0.025, 0.0125])
    assert ts["step"] == [1, 2, 3]


def test_names_every_group_of_every_optimizer_and_disambiguates_repeated_classes() -> None:
    model = TinyModel()
    first = torch.optim.SGD(
        [{"params": [model.lin.weight], "lr": 0.1}, {"params": [model.lin.bias], "lr": 0.2}]
    )
    extra = torch.nn.Parameter(torch.zeros(1))
    second = torch.optim.SGD([extra], lr=0.3)
    third = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
    logs = InMemoryLogger()
    Trainer(model, make_loader(2), "1ep", optimizers=[first, second, third],
            callbacks=[LRMonitor()], loggers=[logs]).fit_sync()  # fmt: skip
    lrs = {k: v for k, v in logs.most_recent_values.items() if k.startswith("lr-")}
    assert lrs == {
        "lr-SGD/group0": 0.1,
        "lr-SGD/group1": 0.2,
        "lr-SGD-1/group0": 0.3,
        "lr-Adam/group0": 0.4,
    }
    assert len(logs.get_timeseries("lr-Adam/group0")["step"]) == 2


def test_tensor_learning_rates_are_logged_as_numbers() -> None:
    model = TinyModel()
    opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
    logs = InMemoryLogger()
    Trainer(model, make_loader(2), "1ep", optimizers=opt,
            callbacks=[LRMonitor()], loggers=[logs]).fit_sync()  # fmt: skip
    assert logs.most_recent_values["lr-Adam/group0"] == pytest.approx(0.01)


def test_exact_without_barriers_because_it_reads_in_lockstep() -> None:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    logs = InMemoryLogger()
    Trainer(model, make_loader(6), "1ep", optimizers=opt, schedulers=sched, barriers=(),
            callbacks=[LRMonitor()], loggers=[logs]).fit_sync()  # fmt: skip
    got = logs.get_timeseries("lr-SGD/group0")["lr-SGD/group0"]
    assert got == pytest.approx([1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6, 1 / 7])
    (handler,) = resolve_callback(LRMonitor()).handlers.values()
    assert handler.is_blocking
    assert not handler.is_async
