"""The Trainer's argument checks that need more than one line: each names the argument and the fix.

Everything here runs in ``Trainer.__init__`` before the model moves, the seed is set or
any callback sees ``INIT``, so a bad argument costs nothing but the error.
"""

from __future__ import annotations

import inspect
import math
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trainbus.core.callback import Callback
from trainbus.core.destination import LoggerDestination
from trainbus.core.time import Time, TimeUnit, ensure_time

__all__ = [
    "what_callbacks_write",
    "check_callbacks",
    "check_eval_interval",
    "check_grad_clip_norm",
    "check_loss",
    "check_max_duration",
    "check_model",
    "check_optimizers",
    "check_optimizers_train_the_model",
    "check_preempt_deadline",
    "check_run_name",
    "check_schedulers",
    "check_schedulers_step_the_optimizers",
    "destinations_first",
]


def check_max_duration(value: Time[Any] | str | int, *, name: str = "max_duration") -> Time[Any]:
    """``value`` as a :class:`Time` that trains something: finite, positive, not in ``dur``."""
    duration = ensure_time(value, name=name)
    if duration.unit is TimeUnit.DURATION:
        raise ValueError(
            f"{name}={value!r} is a fraction of itself; use ep, ba, sp or tok units, e.g. '2ep'"
        )
    amount = float(duration.value)
    if not math.isfinite(amount):
        raise ValueError(
            f"{name}={value!r} is not a finite amount; give a number of epochs or batches, "
            "e.g. '10ep' or Time(500, 'ba')"
        )
    if amount <= 0:
        raise ValueError(
            f"{name}={value!r} trains nothing; give a positive duration, e.g. '1ep' or '100ba'"
        )
    return duration


def check_eval_interval(value: Time[Any] | str | int) -> Time[int]:
    """``value`` as a whole positive number of epochs or batches."""
    interval = ensure_time(value, name="eval_interval")
    hint = "e.g. '1ep' or '100ba'"
    if interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or not interval.value > 0:
        raise ValueError(
            f"eval_interval={value!r} must be a positive number of epochs or batches, {hint}"
        )
    amount = float(interval.value)
    if not math.isfinite(amount) or amount != int(amount):
        raise ValueError(
            f"eval_interval={value!r} must be a whole number of epochs or batches: evaluation "
            f"runs after a whole epoch or batch; {hint} (to evaluate twice per epoch, give "
            "half the epoch's batches in 'ba')"
        )
    return Time(int(amount), interval.unit)


def check_run_name(run_name: object) -> None:
    """``run_name`` is ``None`` or a ``str``."""
    if run_name is not None and not isinstance(run_name, str):
        raise TypeError(
            f"run_name must be a str, got {run_name!r} ({type(run_name).__qualname__}); "
            f"e.g. run_name='{run_name}', or None for a generated name"
        )


def check_grad_clip_norm(grad_clip_norm: object) -> float | None:
    """``grad_clip_norm`` as a positive finite float, or ``None`` (no clipping)."""
    if grad_clip_norm is None:
        return None
    if (
        isinstance(grad_clip_norm, bool)
        or not isinstance(grad_clip_norm, int | float)
        or not math.isfinite(grad_clip_norm)
        or grad_clip_norm <= 0
    ):
        raise ValueError(
            f"grad_clip_norm={grad_clip_norm!r} must be a positive number (the largest L2 norm "
            "of all gradients together), e.g. 1.0, or None for no clipping"
        )
    return float(grad_clip_norm)


def _is_callback_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Callback)


def check_callbacks(callbacks: Sequence[Any], loggers: Sequence[Any]) -> None:
    """No callback class instead of an instance; no instance given twice (a destination in
    both ``callbacks`` and ``loggers`` is one destination: :func:`destinations_first`)."""
    seen: dict[int, str] = {}
    in_both = {id(d) for d in loggers if isinstance(d, LoggerDestination)}
    in_both &= {id(cb) for cb in callbacks}
    named = [(f"callbacks[{i}]", cb) for i, cb in enumerate(callbacks)]
    named += [(f"loggers[{i}]", dest) for i, dest in enumerate(loggers)]
    for where, cb in named:
        if _is_callback_class(cb):
            raise TypeError(
                f"{where} is the class {cb.__qualname__}, not an instance; pass an instance: "
                f"{cb.__qualname__}()"
            )
        first = seen.setdefault(id(cb), where)
        if first != where and not (id(cb) in in_both and where.startswith("loggers")):
            raise ValueError(
                f"{where} is the same {type(cb).__qualname__} instance as {first}, so it would "
                "see every event twice; pass it once (or create a second instance)"
            )


def destinations_first(
    callbacks: Sequence[Any], loggers: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """``(callbacks, loggers)`` with every :class:`LoggerDestination` of ``callbacks`` among
    the loggers: a destination is one wherever it is passed (Lightning users put loggers
    beside callbacks), and receives every record, ``loss/train`` included. One passed in
    both lists is registered once, where ``loggers`` has it."""
    in_loggers = {id(d) for d in loggers}
    plain = [cb for cb in callbacks if not isinstance(cb, LoggerDestination)]
    moved = [
        cb for cb in callbacks if isinstance(cb, LoggerDestination) and id(cb) not in in_loggers
    ]
    return plain, [*loggers, *moved]


def check_optimizers(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Refuse optimizers that only work with a closure (the trainer steps without one)."""
    for i, opt in enumerate(optimizers):
        if isinstance(opt, torch.optim.LBFGS):
            raise TypeError(
                f"optimizers[{i}] is LBFGS, which re-evaluates the batch through a closure; "
                "trainbus calls optimizer.step() without one (docs/training-loop.md). Use a "
                "first-order optimizer such as torch.optim.AdamW"
            )


def check_optimizers_train_the_model(
    optimizers: Sequence[torch.optim.Optimizer], model: torch.nn.Module
) -> None:
    """Refuse optimizers of which none holds a parameter of ``model``: they train nothing.

    An optimizer built over another model's parameters (a copy, a model built twice) steps
    tensors the loss never reaches, so the run would train nothing and say nothing. Extra
    parameters beside the model's (a learnable loss) are fine.
    """
    if not optimizers:
        return
    mine = {id(p) for p in model.parameters()}
    if not mine:
        return  # a model without parameters: nothing to check against
    if any(id(p) in mine for opt in optimizers for g in opt.param_groups for p in g["params"]):
        return
    which = "optimizers" if len(optimizers) > 1 else "optimizers[0]"
    held = sum(len(g["params"]) for opt in optimizers for g in opt.param_groups)
    raise ValueError(
        f"{which} ({', '.join(type(o).__qualname__ for o in optimizers)}) holds {held} "
        f"parameter tensor(s), none of them the model's ({type(model).__qualname__}), so "
        "training would change nothing; build it over the model you pass: e.g. "
        "optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3), with that same model"
    )


def check_preempt_deadline(deadline: object, timeout: object) -> float | None:
    """``preempt()``'s deadline as a ``time.monotonic()`` value (``None``: the grace
    period): ``deadline`` is one already, ``timeout`` is seconds from now."""
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, int | float)
        or deadline != deadline
    ):
        raise TypeError(
            f"deadline={deadline!r} must be a time.monotonic() value, e.g. "
            "time.monotonic() + 60 (or timeout=60), or None for the grace period"
        )
    if timeout is not None:
        if deadline is not None:
            raise TypeError(
                "preempt() got both deadline= and timeout=; pass one: timeout= in "
                "seconds from now, or deadline= a time.monotonic() value"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            timeout >= 0
        ):
            raise ValueError(
                f"timeout={timeout!r} must be seconds from now >= 0, e.g. timeout=60"
            )
        deadline = time.monotonic() + timeout
    return deadline


def _resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device={device!r} is not a device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available; use 'auto' or 'cpu'")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r} is not supported; use 'auto', 'cpu' or 'cuda'")
    return resolved


def check_model(model: object, train_dataloader: object) -> None:
    """``model`` is a ``torch.nn.Module``; the hint says what to do with what it is."""
    if isinstance(model, torch.nn.Module):
        return
    got = type(model).__qualname__
    if isinstance(train_dataloader, torch.nn.Module):
        raise TypeError(
            f"model is a {got} and train_dataloader a {type(train_dataloader).__qualname__} "
            "(an nn.Module): they look swapped; the order is Trainer(model, "
            "train_dataloader, max_duration), e.g. Trainer(model, loader, '2ep', ...)"
        )
    if isinstance(model, Iterable | torch.utils.data.Dataset):
        hint = "pass the model first: Trainer(model, train_dataloader, max_duration)"
    elif callable(model):
        hint = "wrap your function in an nn.Module (its forward calls the function)"
    else:
        hint = "pass the torch.nn.Module to train, e.g. Trainer(torch.nn.Linear(4, 2), ...)"
    raise TypeError(f"model must be a torch.nn.Module, got {got}; {hint}")


def _accepts_two(fn: Any) -> bool | None:
    """Whether ``fn(a, b)`` binds; ``None`` when its signature cannot be read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None)
    except TypeError:
        return False
    return True


def _params(fn: Any) -> str:
    """``fn``'s parameters as a user wrote them, names only: ``(outputs)``."""
    return "(" + ", ".join(inspect.signature(fn).parameters) + ")"


def check_loss(model: torch.nn.Module, loss_fn: Any) -> None:
    """The loss takes ``(outputs, targets)`` (or ``(outputs, batch)``): checked now,
    from its signature, rather than as torch's ``TypeError`` at the first batch."""
    model_loss = getattr(model, "loss", None)
    if callable(model_loss):
        if _accepts_two(model_loss) is False:
            raise TypeError(
                f"model.loss{_params(model_loss)} must take (outputs, batch): "
                "trainbus calls model.loss(outputs, batch) (Composer's convention), e.g. "
                "def loss(self, outputs, batch): return F.cross_entropy(outputs, batch[1])"
            )
        return
    if loss_fn is not None and _accepts_two(loss_fn) is False:
        name = getattr(loss_fn, "__name__", type(loss_fn).__qualname__)
        raise TypeError(
            f"loss_fn={name}{_params(loss_fn)} must take two arguments: trainbus "
            "calls loss_fn(outputs, targets) for (inputs, targets) batches and "
            "loss_fn(outputs, batch) for dict batches, e.g. loss_fn=F.cross_entropy or "
            "def loss(outputs, targets): ...; for a loss of the whole batch define "
            "model.loss(outputs, batch) instead"
        )


def check_schedulers(schedulers: object) -> list[Any]:
    """``schedulers`` as a list of objects with a ``step()``; a bare function (an lr
    lambda) or a scheduler class gets the wrapping that makes it one."""
    if schedulers is None:
        return []
    items = list(schedulers) if isinstance(schedulers, list | tuple) else [schedulers]
    for i, sched in enumerate(items):
        where = f"schedulers[{i}]" if isinstance(schedulers, list | tuple) else "schedulers"
        if isinstance(sched, type):
            raise TypeError(
                f"{where} is the class {sched.__qualname__}, not a scheduler; build it over "
                f"the optimizer: {sched.__qualname__}(optimizer, ...)"
            )
        if callable(getattr(sched, "step", None)):
            continue
        if callable(sched):
            raise TypeError(
                f"{where} is a function, not a learning-rate scheduler (the trainer calls "
                "its step() after every batch); wrap it: torch.optim.lr_scheduler.LambdaLR("
                "optimizer, lr_lambda=fn), where fn(step) returns a factor of the "
                "optimizer's lr (pass that optimizer as optimizers= too)"
            )
        raise TypeError(
            f"{where} is a {type(sched).__qualname__}, which has no step(); pass a "
            "torch.optim.lr_scheduler scheduler (or a list of them), e.g. "
            "torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)"
        )
    return items


def check_schedulers_step_the_optimizers(
    schedulers: Sequence[Any], optimizers: Sequence[torch.optim.Optimizer]
) -> None:
    """A scheduler built over an optimizer the trainer does not step changes no lr that
    matters: refuse it, naming the fix (``optimizers=`` that optimizer)."""
    mine = {id(o) for o in optimizers}
    for i, sched in enumerate(schedulers):
        opt = getattr(sched, "optimizer", None)
        if isinstance(opt, torch.optim.Optimizer) and id(opt) not in mine:
            given = "the default AdamW" if not optimizers else "other optimizers"
            raise ValueError(
                f"schedulers[{i}] ({type(sched).__qualname__}) adjusts an optimizer that the "
                f"trainer does not step (it steps {given}), so its schedule would change "
                "nothing; pass that optimizer too: optimizers=optimizer, "
                "schedulers=Scheduler(optimizer, ...)"
            )


def _check_loader(loader: Any, name: str) -> None:
    if isinstance(loader, torch.utils.data.Dataset) and not isinstance(
        loader, torch.utils.data.IterableDataset | Iterable
    ):
        raise TypeError(
            f"{name} is a {type(loader).__qualname__}, a map-style Dataset: iterating it "
            "gives one sample at a time, not batches; wrap it in a DataLoader, e.g. "
            f"{name}=DataLoader(dataset, batch_size=32"
            f"{', shuffle=True' if name == 'train_dataloader' else ''})"
        )
    if isinstance(loader, torch.nn.Module):
        raise TypeError(
            f"{name} is a {type(loader).__qualname__} (an nn.Module), not batches; pass "
            "the model first: Trainer(model, train_dataloader, max_duration)"
        )
    if not isinstance(loader, Iterable):
        raise TypeError(
            f"{name} must be iterable (a torch DataLoader or any iterable of batches), "
            f"got {type(loader).__qualname__}"
        )
    try:
        empty = len(loader) == 0  # type: ignore[arg-type]
    except TypeError:
        return  # no len(): an empty epoch is reported when it happens
    if empty:
        raise ValueError(f"{name} is empty; give it at least one batch (check drop_last)")


def _default_run_name() -> str:
    return f"trainbus-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _as_list(callbacks: Any, name: str) -> list[Any]:
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, str) or not isinstance(callbacks, Iterable):
        raise TypeError(
            f"{name} must be a list of trainbus.Callback instances, got "
            f"{type(callbacks).__qualname__}; pass {name}=[MyCallback()]"
        )
    return list(callbacks)


def _optimizer_list(optimizers: Any) -> list[torch.optim.Optimizer]:
    opts = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else optimizers
    opts = list(opts) if isinstance(opts, Iterable) else [opts]
    if not opts or not all(isinstance(o, torch.optim.Optimizer) for o in opts):
        raise TypeError(
            f"optimizers={optimizers!r} must be a torch.optim.Optimizer or a list of them; "
            "e.g. optimizers=torch.optim.SGD(model.parameters(), lr=0.1), or None for AdamW"
        )
    return opts


def what_callbacks_write(load_path: object, callbacks: Sequence[object]) -> dict[str, Any]:
    """The folders the run's savers write and the S3 options of its uploader to
    ``load_path``: where ``read_checkpoint`` may find the run's own checkpoints."""
    from trainbus.callbacks.checkpoint_saver import CheckpointSaver
    from trainbus.callbacks.checkpoint_uploader import CheckpointUploader

    url = str(load_path).rstrip("/")
    return {
        "saver_folders": [cb.folder for cb in callbacks if isinstance(cb, CheckpointSaver)],
        "s3_options": next(
            (c.options for c in callbacks if isinstance(c, CheckpointUploader) and c.url == url),
            None,
        ),
    }
