"""The Trainer: validated configuration, ``await trainer.fit()`` and ``fit_sync()``."""

from __future__ import annotations

import functools
import os
import random
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import anyio
import torch

from trainbus._bus import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_INLINE_MAX,
    BusOptions,
    no_running_loop,
)
from trainbus._callback import Callback, resolve_callback
from trainbus._engine import Engine
from trainbus._events import Event
from trainbus._exceptions import EngineThreadError, FitInProgressError
from trainbus._logger import Logger, LoggerDestination
from trainbus._loop import LoopConfig, TrainingLoop
from trainbus._preemption import Preemption, check_preemption
from trainbus._resume import attach_handler_drain, read_checkpoint, restore_checkpoint
from trainbus._state import State
from trainbus._time import Time
from trainbus._trainer_checks import (
    check_callbacks,
    check_eval_interval,
    check_grad_clip_norm,
    check_max_duration,
    check_optimizers,
    check_run_name,
)

__all__ = ["Trainer"]

_PRECISIONS: dict[str | None, torch.dtype | None] = {
    None: None,
    "fp32": None,
    "bf16": torch.bfloat16,
    "amp_bf16": torch.bfloat16,
    "fp16": torch.float16,
    "amp_fp16": torch.float16,
    "amp": torch.float16,  # Composer v0.6's name for fp16 autocast with a grad scaler
}


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


def _check_loader(loader: Any, name: str) -> None:
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


class Trainer:
    """Trains a model on a worker thread while callbacks run on the event loop.

    Args:
        model: A ``torch.nn.Module``. If it defines ``loss(outputs, batch)`` (Composer's
            convention) ``forward`` receives the whole batch, whatever it is; otherwise
            batches are ``(inputs, targets)`` pairs (``model(inputs)``,
            ``loss_fn(outputs, targets)``) or dicts (``model(batch)``,
            ``loss_fn(outputs, batch)``). See ``docs/training-loop.md``.
        train_dataloader: An iterable of batches (a ``DataLoader``).
        max_duration: How long to train: a :class:`Time`, ``"10ep"``/``"500ba"``/... or
            an int (epochs).
        eval_dataloader: Batches for evaluation, or ``None``.
        eval_interval: How often to evaluate: ``"1ep"``, ``"100ba"``, or an int (epochs).
        optimizers: An optimizer or a list; default ``torch.optim.AdamW(lr=1e-3)``.
        schedulers: A scheduler or a list; stepped after every batch.
        callbacks: :class:`Callback` instances, offered events in this order.
        loggers: :class:`LoggerDestination` instances (offered events after callbacks).
        loss_fn: The loss for models without a ``loss`` method: ``loss_fn(outputs,
            targets)`` for pairs, ``loss_fn(outputs, batch)`` for dict batches.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        precision: ``None``/``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast; ``"amp"``,
            Composer's name, is ``"fp16"``). fp16 also scales the loss with a
            ``torch.amp.GradScaler`` (``state.scaler``); the gradients are unscaled
            before ``AFTER_TRAIN_BATCH``.
        grad_accum: Microbatches per batch; forward/loss/backward events repeat for each.
        grad_clip_norm: Clip the L2 norm of all gradients together to this value after
            the last backward (and unscaling), before ``AFTER_TRAIN_BATCH``; ``None``
            (the default) does not clip. Composer v0.6's name.
        barriers: Events (or one Event) at which training waits for every earlier
            handler (D4); ``()`` for none but close.
        max_lag: Batches by which handlers may trail the barrier (D4).
        queue_size: Handler calls that may wait per callback before training waits (D12).
        run_name: The run's name for loggers; generated when not given.
        seed: Seeds Python's and torch's random generators.
        log_train_loss: Log ``loss/train`` after every batch when there are loggers.
        warn_slow_callbacks: Warn when a callback's handlers are slower than a batch.
        inline_max: Seconds. A plain handler whose calls have all taken at most this
            long is queued without waking its thread, and the training thread runs it at
            the next barrier event (where it waits anyway), skipping a thread wake-up. Its
            first call runs on its callback's thread; a call over the limit moves it back
            there for good. ``0`` sends every plain handler to its thread.
        close_timeout: Seconds each callback's ``close`` and ``post_close`` may take, and
            a cancelled ``fit()`` waits for a stuck handler, before it is reported
            (:class:`~trainbus.CallbackTimeoutWarning`) and abandoned; every other
            callback still closes. ``math.inf`` waits for ever.
        load_path: A checkpoint file, or a ``CheckpointSaver`` folder (its newest
            complete checkpoint; an empty folder starts fresh), to resume from. See
            ``docs/checkpoints.md``.
        preemption: ``True`` or a :class:`~trainbus.Preemption`: on SIGTERM (while
            ``fit()`` runs in the main thread) save a checkpoint, stop at the next batch,
            close every logger within a grace period, and make ``fit_sync()`` exit with
            status 143. See ``docs/crash-consistency.md``.

    Example:
        >>> trainer = Trainer(model, loader, "2ep", loss_fn=F.cross_entropy,
        ...                   callbacks=[Upload()], loggers=[JSONLinesLogger("m.jsonl")])
        >>> await trainer.fit()          # in async code
        >>> trainer.fit_sync()           # in a script
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_dataloader: Iterable[Any],
        max_duration: Time[Any] | str | int,
        *,
        eval_dataloader: Iterable[Any] | None = None,
        eval_interval: Time[Any] | str | int = "1ep",
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        schedulers: Any = None,
        callbacks: Sequence[Callback] | Callback = (),
        loggers: Sequence[LoggerDestination] | LoggerDestination = (),
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        device: str | torch.device = "auto",
        precision: str | None = None,
        grad_accum: int = 1,
        grad_clip_norm: float | None = None,
        barriers: Iterable[Event | str] = (Event.BATCH_END,),
        max_lag: int = 0,
        queue_size: int = 128,
        run_name: str | None = None,
        seed: int | None = None,
        log_train_loss: bool = True,
        warn_slow_callbacks: bool = True,
        inline_max: float = DEFAULT_INLINE_MAX,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        load_path: str | os.PathLike[str] | None = None,
        preemption: Preemption | bool = False,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module, got {type(model).__qualname__}; "
                "wrap your function in an nn.Module"
            )
        if not callable(getattr(model, "loss", None)) and loss_fn is None:
            raise ValueError(
                "no loss: define model.loss(outputs, batch) (Composer's convention) or pass "
                "loss_fn=..., e.g. loss_fn=torch.nn.functional.cross_entropy"
            )
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(
                f"loss_fn must be callable, got {type(loss_fn).__qualname__}; "
                "pass a function (outputs, targets) -> loss, e.g. F.cross_entropy"
            )
        _check_loader(train_dataloader, "train_dataloader")
        if eval_dataloader is not None:
            _check_loader(eval_dataloader, "eval_dataloader")
        duration = check_max_duration(max_duration)
        interval = check_eval_interval(eval_interval)
        check_run_name(run_name)
        clip = check_grad_clip_norm(grad_clip_norm)
        self.preemption = check_preemption(preemption)
        if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
            raise ValueError(f"grad_accum={grad_accum!r} must be a positive int, e.g. 1 or 4")
        if precision not in _PRECISIONS:
            raise ValueError(
                f"precision={precision!r} is unknown; use None, 'fp32', 'bf16' or 'fp16' "
                "('amp' is accepted for 'fp16', as in Composer)"
            )
        bus_options = BusOptions.validated(  # one place validates the bus's options
            barriers=barriers,
            max_lag=max_lag,
            queue_size=queue_size,
            inline_max=inline_max,
            warn_slow=warn_slow_callbacks,
            close_timeout=close_timeout,
        )
        resolved_device = _resolve_device(device)
        callbacks = _as_list(callbacks, "callbacks")
        loggers = _as_list(loggers, "loggers")
        check_callbacks(callbacks, loggers)
        opt_list = [] if optimizers is None else _optimizer_list(optimizers)
        check_optimizers(opt_list)
        for i, dest in enumerate(loggers):
            if not isinstance(dest, LoggerDestination):
                resolve_callback(dest, where=f"loggers[{i}]")  # raises for non-callbacks
                raise TypeError(
                    f"loggers[{i}] is a {type(dest).__qualname__}, not a LoggerDestination; "
                    "pass plain callbacks in callbacks=[...]"
                )

        if seed is not None:
            random.seed(seed)
            torch.manual_seed(seed)
        model.to(resolved_device)
        if not opt_list:
            opt_list = [torch.optim.AdamW(model.parameters(), lr=1e-3)]
        if schedulers is None:
            sched_list: list[Any] = []
        elif isinstance(schedulers, list | tuple):
            sched_list = list(schedulers)
        else:
            sched_list = [schedulers]

        self.state = State(
            model=model,
            max_duration=duration,
            optimizers=opt_list,
            schedulers=sched_list,
            train_dataloader=train_dataloader,
            eval_dataloader=eval_dataloader,
            precision=precision or "fp32",
            grad_accum=grad_accum,
            callbacks=[*callbacks, *loggers],
            device=resolved_device,
            run_name=run_name or _default_run_name(),
        )
        if _PRECISIONS[precision] is torch.float16:  # bf16 has fp32's range: no scaler
            self.state.scaler = torch.amp.GradScaler(resolved_device.type)
        self.logger = Logger(self.state)
        self.engine = Engine(
            self.state,
            self.logger,
            self.state.callbacks,
            barriers=bus_options.barriers,
            max_lag=bus_options.max_lag,
            queue_size=bus_options.queue_size,
            warn_slow=bus_options.warn_slow,
            inline_max=bus_options.inline_max,
            close_timeout=bus_options.close_timeout,
        )
        self._config = LoopConfig(
            loss_fn=loss_fn,
            eval_interval=interval,
            autocast_dtype=_PRECISIONS[precision],
            log_train_loss=log_train_loss and bool(loggers),
            grad_clip_norm=clip,
        )
        self._init_delivered = False
        # Read and check the checkpoint before INIT; restore it after, as Composer does.
        checkpoint = None if load_path is None else read_checkpoint(load_path, self.state)
        if no_running_loop():  # as Composer does: INIT handlers run in the constructor
            self.engine._run_once(Event.INIT)
            self._init_delivered = True
        if checkpoint is not None:
            restore_checkpoint(checkpoint, self.state)

    async def fit(self, *, duration: Time[Any] | str | int | None = None) -> None:
        """Train until ``max_duration`` (or for ``duration`` more), then close callbacks.

        The training loop runs on a worker thread; handlers run on this event loop and
        on their callbacks' threads. Returns when training ended and every callback's
        ``close`` and ``post_close`` have run; raises a handler's exception (with a note
        naming the callback and event), or an ``ExceptionGroup`` if several failed.
        Cancelling the awaiting task stops training within one event and still closes.

        Args:
            duration: Train this much longer than the timer says now (continues a
                finished run), instead of up to ``max_duration``.
        """
        state = self.state
        if self.engine.running:
            raise FitInProgressError(
                "this trainer is already fitting; await the running fit() before starting "
                "another, or create a second Trainer"
            )
        if duration is not None:
            extra = check_max_duration(duration, name="duration")
            now = state.timestamp.get(extra.unit)
            state.max_duration = Time(int(now.value) + int(extra.value), extra.unit)
        state._stop.clear()
        loop = TrainingLoop(state, self.logger, self._config, self.engine._bus.publish)
        attach_handler_drain(state, self.engine._bus.wait_all)  # for CheckpointSaver
        deliver_init = not self._init_delivered
        self._init_delivered = True

        def produce() -> None:
            loop.run(deliver_init=deliver_init)

        if self.preemption is None:
            await self.engine.run_cycle(produce)
            return
        with self.preemption.installed(state):
            await self.engine.run_cycle(produce)

    @property
    def preempted(self) -> bool:
        """Whether a preemption signal stopped the last ``fit()``."""
        return self.preemption is not None and self.preemption.signum is not None

    def fit_sync(
        self,
        *,
        duration: Time[Any] | str | int | None = None,
        backend: Literal["asyncio", "trio"] = "asyncio",
    ) -> None:
        """Run :meth:`fit` from plain synchronous code (starts an event loop).

        Raises:
            EngineThreadError: Called on a thread that runs an event loop; use
                ``await trainer.fit()`` there.
            TrainingPreempted: A preemption signal stopped the run (``preemption=``);
                a ``SystemExit`` with the configured status.
        """
        if not no_running_loop():
            raise EngineThreadError(
                "fit_sync() starts its own event loop, but this thread already runs one; "
                "use `await trainer.fit()` instead"
            )
        anyio.run(functools.partial(self.fit, duration=duration), backend=backend)
        if self.preemption is not None:
            self.preemption.raise_if_triggered()  # exits with its status unless caught
