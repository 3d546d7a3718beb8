"""Bad Trainer arguments fail before training starts, naming the argument and the fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers import EventLog, TinyModel, make_loader
from trainbus import Callback, Event, LoggerDestination, Time, TimeUnit, Trainer


def _trainer(**overrides: Any) -> Trainer:
    args: dict[str, Any] = {
        "model": TinyModel(),
        "train_dataloader": make_loader(2),
        "max_duration": "1ep",
        "device": "cpu",
    }
    args.update(overrides)
    return Trainer(**args)


class NotALogger(Callback):
    pass


class Destination(LoggerDestination):
    pass


# (overrides, exception type, a regex the message must match: the argument ... the fix)
BAD_INPUTS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("model-function", {"model": lambda b: b}, TypeError, r"model must be a torch\.nn\.Module.*"
     r"wrap"),
    ("model-none", {"model": None}, TypeError, r"model must be a torch\.nn\.Module"),
    ("no-loss", {"model": torch.nn.Linear(4, 3)}, ValueError, r"no loss.*model\.loss\(outputs, "
     r"batch\).*loss_fn="),
    ("loss-fn-not-callable", {"model": torch.nn.Linear(4, 3), "loss_fn": 3}, TypeError,
     r"loss_fn must be callable.*cross_entropy"),
    ("loader-int", {"train_dataloader": 5}, TypeError, r"train_dataloader must be iterable.*"
     r"DataLoader"),
    ("loader-empty", {"train_dataloader": []}, ValueError, r"train_dataloader is empty.*"
     r"drop_last"),
    ("eval-loader-int", {"eval_dataloader": 5}, TypeError, r"eval_dataloader must be iterable"),
    ("eval-loader-empty", {"eval_dataloader": []}, ValueError, r"eval_dataloader is empty"),
    ("duration-epoch", {"max_duration": "1epoch"}, ValueError, r"max_duration.*'1epoch'.*"
     r"ep, ba, sp, tok"),
    ("duration-x", {"max_duration": "x"}, ValueError, r"max_duration.*'x'.*e\.g\. '1ep'"),
    ("duration-negative", {"max_duration": -1}, ValueError, r"max_duration must not be "
     r"negative.*'10ep'"),
    ("duration-float", {"max_duration": 1.5}, TypeError, r"max_duration must be a Time, a str "
     r"or an int, got 1\.5.*'0\.5dur'"),
    ("duration-dur", {"max_duration": "0.5dur"}, ValueError, r"max_duration='0\.5dur'.*"
     r"e\.g\. '2ep'"),
    ("duration-none", {"max_duration": None}, TypeError, r"max_duration must be a Time"),
    ("interval-zero", {"eval_interval": "0ba"}, ValueError, r"eval_interval='0ba' must be a "
     r"positive number of epochs or batches, e\.g\. '1ep' or '100ba'"),
    ("interval-samples", {"eval_interval": "64sp"}, ValueError, r"eval_interval='64sp'.*'1ep'"),
    ("interval-dur", {"eval_interval": "0.5dur"}, ValueError, r"eval_interval='0\.5dur'"),
    ("interval-bad-string", {"eval_interval": "often"}, ValueError, r"eval_interval.*'often'"),
    ("interval-int-zero", {"eval_interval": 0}, ValueError, r"eval_interval=0 .*'1ep'"),
    ("interval-float", {"eval_interval": 0.5}, TypeError, r"eval_interval must be a Time"),
    ("grad-accum-0", {"grad_accum": 0}, ValueError, r"grad_accum=0 must be a positive int"),
    ("grad-accum-neg", {"grad_accum": -1}, ValueError, r"grad_accum=-1 must be a positive int"),
    ("grad-accum-float", {"grad_accum": 1.5}, ValueError, r"grad_accum=1\.5 must be a positive "
     r"int, e\.g\. 1 or 4"),
    ("grad-accum-bool", {"grad_accum": True}, ValueError, r"grad_accum=True must be a positive "
     r"int"),
    ("device-tpu", {"device": "tpu"}, ValueError, r"device='tpu'.*use 'auto', 'cpu'"),
    ("device-meta", {"device": "meta"}, ValueError, r"device='meta' is not supported.*'cpu'"),
    ("precision", {"precision": "fp8"}, ValueError, r"precision='fp8' is unknown; use None, "
     r"'fp32', 'bf16' or 'fp16'"),
    ("precision-dtype", {"precision": torch.float16}, ValueError, r"precision=torch\.float16 is "
     r"unknown"),
    ("callback-object", {"callbacks": [object()]}, TypeError, r"callbacks\[0\].*not a "
     r"trainbus\.Callback; subclass trainbus\.Callback"),
    ("callback-function", {"callbacks": [print]}, TypeError, r"callbacks\[0\].*subclass"),
    ("callbacks-not-a-list", {"callbacks": 3}, TypeError, r"callbacks must be a list.*"
     r"callbacks=\[MyCallback\(\)\]"),
    ("logger-object", {"loggers": [object()]}, TypeError, r"loggers\[0\].*not a "
     r"trainbus\.Callback"),
    ("logger-plain-callback", {"loggers": [Destination(), NotALogger()]}, TypeError,
     r"loggers\[1\] is a NotALogger, not a LoggerDestination; pass plain callbacks in "
     r"callbacks="),
    ("barriers-unknown", {"barriers": ("batch_ends",)}, ValueError, r"barriers=.*not an Event.*"
     r"Event\.BATCH_END"),
    ("barriers-none", {"barriers": None}, TypeError, r"barriers=None.*\(\) for none"),
    ("max-lag-neg", {"max_lag": -1}, ValueError, r"max_lag=-1 must be an int >= 0.*e\.g\."),
    ("max-lag-float", {"max_lag": 0.5}, ValueError, r"max_lag=0\.5 must be an int >= 0"),
    ("queue-size-0", {"queue_size": 0}, ValueError, r"queue_size=0 must be an int >= 1.*128"),
    ("queue-size-bool", {"queue_size": True}, ValueError, r"queue_size=True must be an int"),
    ("optimizers-int", {"optimizers": 3}, TypeError, r"optimizers=3 must be a "
     r"torch\.optim\.Optimizer.*None for AdamW"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "exc", "match"),
    [pytest.param(o, e, m, id=name) for name, o, e, m in BAD_INPUTS],
)
def test_bad_argument_is_refused_before_training(
    overrides: dict[str, Any], exc: type[Exception], match: str
) -> None:
    log = EventLog()
    model = overrides.get("model", TinyModel())
    with pytest.raises(exc, match=match):
        _trainer(**{"callbacks": [log], **overrides, "model": model})
    assert log.events == []  # not even INIT ran
    if isinstance(model, TinyModel):
        assert model.training_forwards == 0


def test_cuda_when_unavailable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda' but CUDA is not available; use 'auto'"):
        _trainer(device="cuda")
    with pytest.raises(ValueError, match=r"device='cuda:1' but CUDA is not available"):
        _trainer(device="cuda:1")
    assert _trainer(device="auto").state.device == torch.device("cpu")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (3, Time(3, TimeUnit.EPOCH)),
        ("10ba", Time(10, TimeUnit.BATCH)),
        ("64sp", Time(64, TimeUnit.SAMPLE)),
        (Time(2, TimeUnit.EPOCH), Time(2, TimeUnit.EPOCH)),
    ],
)
def test_good_max_durations_are_accepted(given: Any, expected: Time[Any]) -> None:
    assert _trainer(max_duration=given).state.max_duration == expected


def test_good_arguments_in_their_other_forms() -> None:
    one = Destination()
    trainer = _trainer(
        callbacks=EventLog(),  # a single callback
        loggers=one,  # a single destination
        barriers=Event.BATCH_END,  # a single event
        optimizers=[torch.optim.SGD(TinyModel().parameters(), lr=0.1)],
        precision="fp32",
        eval_interval=1,
    )
    assert trainer.state.callbacks[-1] is one
    assert len(trainer.state.callbacks) == 2


def test_a_loader_without_len_that_yields_nothing_fails_at_fit() -> None:
    trainer = _trainer(train_dataloader=iter(()))
    with pytest.raises(ValueError, match=r"train_dataloader produced no batches.*drop_last"):
        trainer.fit_sync()
