"""Bad Trainer arguments fail before training starts, naming the argument and the fix.

Also what cannot be known before training (the batches' format) fails at the first bad
batch with a message that says what a batch must be, and handler-like method names that
no event calls warn.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import trainbus.callbacks
import trainbus.loggers
from tests.helpers import EventLog, TinyModel, make_loader
from trainbus import (
    Callback,
    Event,
    LoggerDestination,
    Time,
    TimeUnit,
    Trainer,
    UnknownHandlerWarning,
)
from trainbus.core.callback import resolve_callback
from trainbus.core.handler_names import warn_unknown_handlers
from trainbus.loggers import InMemoryLogger


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


TWICE, DEST_TWICE = NotALogger(), Destination()
NAN, INF = float("nan"), float("inf")


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
    # issue 12, point 8
    ("duration-0ep", {"max_duration": "0ep"}, ValueError, r"max_duration='0ep' trains nothing; "
     r"give a positive duration, e\.g\. '1ep'"),
    ("duration-0", {"max_duration": 0}, ValueError, r"max_duration=0 trains nothing"),
    ("duration-0ba", {"max_duration": Time(0, "ba")}, ValueError, r"max_duration=.* trains "
     r"nothing"),
    ("run-name-int", {"run_name": 123}, TypeError, r"run_name must be a str, got 123 \(int\); "
     r"e\.g\. run_name='123'"),
    ("callback-twice", {"callbacks": [TWICE, EventLog(), TWICE]}, ValueError, r"callbacks\[2\] "
     r"is the same NotALogger instance as callbacks\[0\].*pass it once"),
    ("logger-twice", {"loggers": [DEST_TWICE, DEST_TWICE]}, ValueError, r"loggers\[1\] is the "
     r"same Destination instance as loggers\[0\]"),
    ("callback-class", {"callbacks": [NotALogger]}, TypeError, r"callbacks\[0\] is the class "
     r"NotALogger, not an instance; pass an instance: NotALogger\(\)"),
    ("logger-class", {"loggers": [Destination]}, TypeError, r"loggers\[0\] is the class "
     r"Destination, not an instance; pass an instance: Destination\(\)"),
    ("grad-clip-0", {"grad_clip_norm": 0}, ValueError, r"grad_clip_norm=0 must be a positive "
     r"number.*e\.g\. 1\.0, or None"),
    ("grad-clip-nan", {"grad_clip_norm": NAN}, ValueError, r"grad_clip_norm=nan must be"),
    ("grad-clip-str", {"grad_clip_norm": "1.0"}, ValueError, r"grad_clip_norm='1\.0' must be"),
    ("optimizer-lbfgs", {"optimizers": torch.optim.LBFGS(TinyModel().parameters())}, TypeError,
     r"optimizers\[0\] is LBFGS.*closure.*torch\.optim\.AdamW"),
    # issue 28, point 5: an optimizer over another model's parameters trained nothing, silently
    ("optimizer-other-model", {"optimizers": torch.optim.SGD(TinyModel().parameters(), lr=0.1)},
     ValueError, r"optimizers\[0\] \(SGD\) holds 2 parameter tensor\(s\), none of them the "
     r"model's \(TinyModel\).*optimizers=torch\.optim\.AdamW\(model\.parameters\(\)"),
    ("optimizers-other-model", {"optimizers": [torch.optim.SGD(TinyModel().parameters(), lr=0.1),
                                               torch.optim.Adam(TinyModel().parameters())]},
     ValueError, r"optimizers \(SGD, Adam\) holds 4 parameter tensor\(s\), none of them"),
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
    model = TinyModel()
    trainer = _trainer(
        model=model,
        callbacks=EventLog(),  # a single callback
        loggers=one,  # a single destination
        barriers=Event.BATCH_END,  # a single event
        optimizers=[torch.optim.SGD(model.parameters(), lr=0.1)],
        precision="fp32",
        eval_interval=1,
    )
    assert trainer.state.callbacks[-1] is one
    assert len(trainer.state.callbacks) == 2


def test_a_loader_without_len_that_yields_nothing_fails_at_fit() -> None:
    trainer = _trainer(train_dataloader=iter(()))
    with pytest.raises(ValueError, match=r"train_dataloader produced no batches.*drop_last"):
        trainer.fit_sync()


def test_fit_with_a_duration_that_trains_nothing_is_refused() -> None:
    trainer = _trainer()
    with pytest.raises(ValueError, match=r"duration='0ba' trains nothing"):
        trainer.fit_sync(duration="0ba")
    with pytest.raises(ValueError, match=r"Time\(nan, 'ba'\).*finite"):
        trainer.fit_sync(duration=Time(float("nan"), "ba"))


def test_a_callback_class_given_to_the_engine_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"callbacks got the class NotALogger, not an instance; "
                       r"pass an instance: NotALogger\(\)"):  # fmt: skip
        resolve_callback(NotALogger)


# -- handler-like names that no event calls -------------------------------------------------


def _handler(self: Any, state: Any, logger: Any) -> None: ...
def _no_args(self: Any) -> None: ...
def _one_arg(self: Any, response: Any) -> None: ...


_METHODS = {"self, state, logger": _handler, "self": _no_args, "self, response": _one_arg}


def _callback_with(name: str, params: str = "self, state, logger") -> Callback:
    """An instance of a ``MyCallback`` class with one method ``name(params)``."""
    return type("MyCallback", (Callback,), {name: _METHODS[params]})()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("on_batch_end", "batch_end"),  # Lightning's and Keras's habit
        ("on_train_batch_end", "batch_end"),  # Lightning's hook
        ("on_validation_end", "eval_end"),
        ("on_epoch_start", "epoch_start"),
        ("batch_ends", "batch_end"),  # typos
        ("epoch_edn", "epoch_end"),
        ("afterbackward", "after_backward"),
        ("on_fit_ended", "fit_end"),
    ],
)
def test_a_handler_like_name_that_matches_no_event_warns_naming_the_event(
    name: str, meant: str
) -> None:
    log = EventLog()
    with pytest.warns(UnknownHandlerWarning) as caught:
        _trainer(callbacks=[log, _callback_with(name)])
    (warning,) = caught
    assert str(warning.message).startswith(f"MyCallback.{name} matches no event")
    assert f"rename it to {meant} (Event.{Event(meant).name})" in str(warning.message)
    assert log.events == [(Event.INIT, 0)]  # a warning, not an error: the trainer is built


def test_the_warning_points_at_the_method() -> None:
    class Lightning(Callback):
        def on_batch_end(self, state: Any, logger: Any) -> None:
            pass

    with pytest.warns(UnknownHandlerWarning) as caught:
        resolve_callback(Lightning())
    assert caught[0].filename == __file__
    assert caught[0].lineno == Lightning.on_batch_end.__code__.co_firstlineno


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("batch_size", "self"),  # close to batch_start, but no (state, logger)
        ("on_upload_done", "self, response"),  # on_..., but like no event
        ("summary", "self, state, logger"),
        ("upload", "self, state, logger"),
        ("batch_end_time", "self"),
    ],
)
def test_ordinary_helper_methods_do_not_warn(name: str, params: str) -> None:
    _trainer(callbacks=[_callback_with(name, params)])  # filterwarnings = error


def test_a_run_event_override_gets_every_event_so_names_do_not_matter() -> None:
    class Router(Callback):
        def run_event(self, event: Event, state: Any, logger: Any) -> None:
            pass

        def on_batch_end(self, state: Any, logger: Any) -> None:
            pass

    resolve_callback(Router())  # filterwarnings = error


@pytest.mark.parametrize(
    "cls",
    [
        getattr(module, name)
        for module in (trainbus.callbacks, trainbus.loggers)
        for name in module.__all__
        if isinstance(getattr(module, name), type) and issubclass(getattr(module, name), Callback)
    ],
)
def test_no_builtin_callback_has_a_handler_like_name_that_no_event_calls(cls: type) -> None:
    warn_unknown_handlers(cls.__new__(cls), Callback)  # filterwarnings = error


# -- batch formats ----------------------------------------------------------------------------


class DictModel(torch.nn.Module):
    """Hugging Face style: ``forward`` takes the batch dict."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)
        self.inputs: list[Any] = []

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.inputs.append(batch)
        return self.lin(batch["x"])


def _dict_loader(n_batches: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(4, generator=g), "y": torch.randint(0, 3, (), generator=g)}
            for _ in range(4 * n_batches)]  # fmt: skip
    return DataLoader(rows, batch_size=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_dict_batches_go_whole_to_the_model_and_to_loss_fn(grad_accum: int) -> None:
    model = DictModel()
    seen: list[tuple[type, tuple[int, ...]]] = []

    def loss_fn(outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append((type(batch), tuple(batch["y"].shape)))
        return F.cross_entropy(outputs, batch["y"])

    before = model.lin.weight.detach().clone()
    _trainer(model=model, train_dataloader=_dict_loader(2), loss_fn=loss_fn,
             eval_dataloader=_dict_loader(1), grad_accum=grad_accum).fit_sync()  # fmt: skip
    size = 4 // grad_accum
    assert seen == [(dict, (size,))] * 2 * grad_accum + [(dict, (4,))]  # 2 train, 1 eval
    assert all(isinstance(b, dict) and set(b) == {"x", "y"} for b in model.inputs)
    assert not torch.equal(before, model.lin.weight)


class DictModelWithLoss(DictModel):
    def loss(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(outputs, batch["y"])


def test_dict_batches_with_model_loss() -> None:
    model = DictModelWithLoss()
    memory = InMemoryLogger()
    _trainer(model=model, train_dataloader=_dict_loader(3), loggers=[memory]).fit_sync()
    assert len(memory.get_timeseries("loss/train")["loss/train"]) == 3


class AutoEncoder(torch.nn.Module):
    """A bare-tensor model: ``forward(batch)`` and ``loss(outputs, batch)`` on the tensor."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(batch)
        return out

    def loss(self, outputs: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(outputs, batch)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_bare_tensor_batches_with_model_loss(grad_accum: int) -> None:
    memory = InMemoryLogger()
    loader = DataLoader(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)),
                        batch_size=4)  # fmt: skip
    model = AutoEncoder()
    _trainer(model=model, train_dataloader=loader, max_duration="5ep", loggers=[memory],
             optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
             grad_accum=grad_accum).fit_sync()  # fmt: skip
    losses = memory.get_timeseries("loss/train")["loss/train"]
    assert len(losses) == 15
    assert losses[12] < losses[0]  # the same batch, four epochs later


TENSORS = DataLoader(torch.randn(8, 4), batch_size=4)
TRIPLES = DataLoader(TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long),
                                   torch.ones(8)), batch_size=4)  # fmt: skip


@pytest.mark.parametrize(
    ("loaders", "match"),
    [
        ({"train_dataloader": TENSORS}, r"train_dataloader produced a bare Tensor of shape "
         r"\(4, 4\), but with loss_fn \(and no model\.loss\) a batch must be an \(inputs, "
         r"targets\) pair.*or a dict.*define model\.loss\(outputs, batch\)"),
        ({"train_dataloader": TRIPLES}, r"train_dataloader produced a list of 3 items, but"),
        ({"train_dataloader": ["ab", "cd"]}, r"train_dataloader produced a str, but"),
        ({"eval_dataloader": TENSORS}, r"eval_dataloader produced a bare Tensor of shape"),
    ],
    ids=["bare-tensor", "three-items", "strings", "eval-bare-tensor"],
)
def test_a_batch_that_fits_no_convention_fails_at_the_first_batch_saying_what_it_must_be(
    loaders: dict[str, Any], match: str
) -> None:
    log = EventLog()
    model = torch.nn.Linear(4, 3)
    trainer = _trainer(model=model, loss_fn=F.cross_entropy, callbacks=[log], **loaders)
    with pytest.raises(TypeError, match=match):
        trainer.fit_sync()
    in_eval = "eval_dataloader" in loaders
    assert (Event.BEFORE_FORWARD in log.names) is in_eval  # no event of the bad batch
    assert Event.EVAL_BEFORE_FORWARD not in log.names


@pytest.mark.parametrize(
    ("value", "unit", "match"),
    [
        (0.5, "ep", r"Time\(0\.5, 'ep'\).*use an int"),
        (2.5, "ba", r"Time\(2\.5, 'ba'\).*use an int"),
        (NAN, "ba", r"Time\(nan, 'ba'\).*finite"),
        (INF, "ep", r"Time\(inf, 'ep'\).*finite"),
    ],
)
def test_a_fractional_or_infinite_time_is_refused_where_it_is_written(
    value: float, unit: str, match: str
) -> None:
    # issue 12, point 8: Time(0.5, "ep") or Time(nan, "ba") used to reach the trainer and
    # fail after an epoch (or train forever); it is now refused where it is built.
    with pytest.raises(ValueError, match=match):
        Time(value, unit)


def test_an_optimizer_over_the_model_and_extra_parameters_is_accepted() -> None:
    """A learnable loss beside the model is fine: only an optimizer set that holds none of
    the model's parameters is refused."""
    model = TinyModel()
    temperature = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.1)
    _trainer(model=model, optimizers=opt).fit_sync()
    assert model.training_forwards == 2


# -- issue 28, point 4: what the first batch's model and loss calls got, named -------------


class TupleModel(torch.nn.Module):
    """Returns ``(logits, hidden)``: ``cross_entropy`` cannot take that tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


class FloatLoss(TinyModel):
    def loss(self, outputs: torch.Tensor, batch: Any) -> Any:
        return super().loss(outputs, batch).item()


def _per_sample(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, y, reduction="none")


def _as_float(outputs: torch.Tensor, y: torch.Tensor) -> float:
    return F.cross_entropy(outputs, y).item()


def _detached(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.detach(), y)


FIRST_BATCH_ERRORS: list[tuple[str, dict[str, Any], type[Exception], str, bool]] = [
    # (id, overrides, exception, message, chained: raised from torch's own error)
    ("per-sample-losses", {"model": torch.nn.Linear(4, 3), "loss_fn": _per_sample}, ValueError,
     r"loss_fn returned a Tensor of shape \(4,\) \(one loss per sample\?\), but the loss must "
     r"be a scalar: reduce it, e\.g\. return losses\.mean\(\).*reduction='mean'", False),
    ("float-loss", {"model": torch.nn.Linear(4, 3), "loss_fn": _as_float}, TypeError,
     r"loss_fn returned a float \(\d.*\), but the loss must be a scalar torch\.Tensor.*return "
     r"the tensor itself, without \.item\(\)", False),
    ("float-model-loss", {"model": FloatLoss()}, TypeError, r"model\.loss returned a float", False),
    ("detached-loss", {"model": torch.nn.Linear(4, 3), "loss_fn": _detached}, ValueError,
     r"loss_fn returned a Tensor that does not require grad.*\.detach\(\)", False),
    ("dict-batch-tensor-model", {"model": torch.nn.Linear(4, 3), "loss_fn": F.cross_entropy,
                                 "train_dataloader": _dict_loader(2)}, TypeError,
     r"model\(batch\) got a dict with keys 'x', 'y' \(trainbus passes a dict batch whole to the "
     r"model\), and the model refused it: linear\(\): argument 'input'.*must be Tensor, not "
     r"dict; make forward take the dict, e\.g\. def forward\(self, batch\).*or have the loader "
     r"yield \(inputs, targets\) pairs", True),
    ("tuple-outputs", {"model": TupleModel(), "loss_fn": F.cross_entropy}, TypeError,
     r"loss_fn\(outputs, targets\) got outputs = a tuple of 2 \(Tensor, Tensor\) from the "
     r"model, and loss_fn refused them: .*must be Tensor, not tuple; return one tensor from "
     r"forward, or pick it in the loss, e\.g\. .*F\.cross_entropy\(outputs\[0\], y\)", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "exc", "match", "chained"),
    [pytest.param(o, e, m, c, id=name) for name, o, e, m, c in FIRST_BATCH_ERRORS],
)
def test_the_first_batch_names_what_the_model_or_the_loss_got_and_what_to_pass(
    overrides: dict[str, Any], exc: type[Exception], match: str, chained: bool
) -> None:
    """Regression: each of these raised torch's own error from deep inside the step
    ("grad can be implicitly created only for scalar outputs", "'float' object has no
    attribute 'detach'", "linear(): argument 'input' must be Tensor, not dict", ...)."""
    log = EventLog()
    trainer = _trainer(callbacks=[log], **overrides)
    with pytest.raises(exc, match=match) as info:
        trainer.fit_sync()
    assert (info.value.__cause__ is not None) is chained
    assert Event.AFTER_BACKWARD not in log.names  # it failed at the first batch


def test_only_the_first_batch_is_checked() -> None:
    """After the first batch, the calls go straight to the model and the loss: a loss that
    turns into per-sample losses later gets torch's own error, not the check's."""
    calls = 0

    def later_per_sample(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return F.cross_entropy(outputs, y, reduction="mean" if calls == 1 else "none")

    trainer = _trainer(model=torch.nn.Linear(4, 3), loss_fn=later_per_sample)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        trainer.fit_sync()
    assert calls == 2
