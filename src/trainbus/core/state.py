"""Training state, and the per-event snapshots handlers see.

The training thread owns one :class:`State`. The fields that change every batch
(``batch``, ``batch_num_samples``, ``batch_num_tokens``, ``outputs``, ``loss``,
``current_metrics`` and the timer's counters) live in an immutable frame that is replaced,
never mutated, when the trainer assigns them. Publishing an event captures the current
frame and timestamp by reference, so a handler that runs late still reads the values of
its own event (guarantee D5) at the cost of one small object per publication. Model
parameters, optimizers and everything else are shared, live objects.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from trainbus.core.evaluator import Evaluator, evaluators_of
from trainbus.core.notice import PreemptionNotice
from trainbus.core.serializable import Serializable
from trainbus.core.time import Time, TimeUnit, ensure_time
from trainbus.core.timer import Timer, Timestamp

__all__ = ["State"]


class _Frame:
    """The per-batch fields of the state, replaced as a whole on every change."""

    __slots__ = (
        "batch",
        "batch_num_samples",
        "batch_num_tokens",
        "current_metrics",
        "loss",
        "outputs",
    )

    batch: Any
    batch_num_samples: int
    batch_num_tokens: int
    current_metrics: dict[str, dict[str, Any]]
    loss: Any
    outputs: Any

    def replace(self, name: str, value: Any) -> _Frame:
        # Written out, not a loop over __slots__: the training thread replaces the frame
        # four times a batch (a dozen getattr/setattr calls each, looped).
        new = _Frame.__new__(_Frame)
        new.batch = self.batch
        new.batch_num_samples = self.batch_num_samples
        new.batch_num_tokens = self.batch_num_tokens
        new.current_metrics = self.current_metrics
        new.loss = self.loss
        new.outputs = self.outputs
        setattr(new, name, value)
        return new


def _empty_frame() -> _Frame:
    frame = _Frame.__new__(_Frame)
    frame.batch = None
    frame.batch_num_samples = 0
    frame.batch_num_tokens = 0
    frame.current_metrics = {}
    frame.loss = None
    frame.outputs = None
    return frame


def _as_list(value: Any) -> list[Any]:
    """``None`` -> ``[]``, a list or tuple -> a list of its items, anything else -> ``[value]``."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _loader_len(loader: Any) -> int | None:
    """``len(loader)``, or ``None`` for a loader (an iterable) without a length."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return None


def _frame_property(name: str, doc: str) -> property:
    def get(self: State) -> Any:
        return getattr(self._frame, name)

    def set_(self: State, value: Any) -> None:
        self._set_frame(name, value)

    return property(get, set_, doc=doc)


class State(Serializable):
    """Everything a callback may read about the run.

    Handlers receive a snapshot of the state taken when their event was published:
    ``timer``/``timestamp``, ``batch``, ``batch_num_samples``, ``batch_num_tokens``,
    ``outputs``, ``loss`` and ``current_metrics`` are the values of that event, even if
    the handler runs later. ``model``, ``optimizers``, ``schedulers`` and the data
    loaders are the live objects.

    Attributes:
        model: The user's ``torch.nn.Module`` (never the DDP wrapper; see ``ddp_model``).
        optimizers: The optimizers, always a list.
        schedulers: The learning-rate schedulers, always a list.
        max_duration: How long ``fit()`` trains, as a :class:`Time`.
        train_dataloader: The training data loader.
        steps_per_epoch: Batches trained per epoch (settable; see the property).
        eval_dataloader: The evaluation data loader, or ``None``.
        evaluators: Composer v0.6's view of it: ``[Evaluator("eval", ...)]`` or ``[]``.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``.
        grad_accum: Number of microbatches per batch.
        callbacks: The callbacks, loggers last.
        device: The device the model trains on.
        run_name: The run's name, used by loggers.
        scaler: The ``torch.amp.GradScaler`` of an fp16 run (as Composer's
            ``state.scaler``), else ``None``. The trainer scales each backward with it and
            unscales the gradients before ``AFTER_TRAIN_BATCH``; its state is in
            :meth:`state_dict`.
        rank: This process's global rank under ``torchrun`` (``0`` in a single process).
        world_size: The number of training processes (``1`` in a single process).
        local_rank: This process's rank on its machine (``0`` in a single process).
        preemption: ``None``, or the :class:`~trainbus.core.notice.PreemptionNotice`
            (``reason``, ``deadline``, ``time_left()``) once the run has been told to stop
            (a signal, ``trainer.preempt()``, another rank). Live: a handler sees it as
            soon as it is given, whatever event it runs for.
    """

    batch = _frame_property("batch", "The current batch as the data loader produced it.")
    batch_num_samples = _frame_property("batch_num_samples", "Samples in the current batch.")
    batch_num_tokens = _frame_property("batch_num_tokens", "Tokens in the current batch.")
    outputs = _frame_property("outputs", "The model's outputs for the current (micro)batch.")
    loss = _frame_property("loss", "The loss tensor of the current (micro)batch.")
    current_metrics = _frame_property(
        "current_metrics",
        'Latest metrics by split, e.g. ``{"eval": {"loss": 0.31, "accuracy": 0.9}}``.',
    )

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        max_duration: Time[Any] | str | int,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = (),
        schedulers: Any = (),
        train_dataloader: Any = None,
        eval_dataloader: Any = None,
        precision: str = "fp32",
        grad_accum: int = 1,
        callbacks: Sequence[Any] = (),
        device: torch.device | str = "cpu",
        run_name: str = "run",
    ) -> None:
        self._frame = _empty_frame()
        self._timer = Timer()
        self._stop = threading.Event()
        self.model = model
        self.ddp_model: torch.nn.Module = model
        self.max_duration = max_duration
        self._optimizers: list[torch.optim.Optimizer] = []
        self._schedulers: list[Any] = []
        self.optimizers = optimizers
        self.schedulers = schedulers
        self.train_dataloader = train_dataloader
        self._steps_per_epoch: int | None = None
        self.eval_dataloader = eval_dataloader
        self.precision = precision
        self.grad_accum = grad_accum
        self.callbacks = list(callbacks)
        self.device = torch.device(device)
        self.run_name = run_name
        self.scaler: torch.amp.GradScaler | None = None
        self.rank = 0
        self.world_size = 1
        self.local_rank = 0
        self.preemption: PreemptionNotice | None = None

    # -- Composer-compatible fields ---------------------------------------------------------

    @property
    def max_duration(self) -> Time[Any]:
        """How long ``fit()`` trains; assign a :class:`Time`, a time string or an int (epochs)."""
        duration: Time[Any] = self._max_duration
        return duration

    @max_duration.setter
    def max_duration(self, value: Time[Any] | str | int) -> None:
        duration = ensure_time(value, name="max_duration")
        if not math.isfinite(float(duration.value)):
            raise ValueError(
                f"max_duration={value!r} is not a finite amount; e.g. '10ep' or Time(500, 'ba')"
            )
        if duration.unit is TimeUnit.DURATION:
            raise ValueError(
                f"max_duration={value!r} is a fraction of itself; use ep, ba, sp or tok units, "
                "e.g. '2ep' or state.timer.batch"
            )
        self._max_duration = duration

    @property
    def evaluators(self) -> list[Evaluator]:
        """Composer v0.6's ``state.evaluators``: one :class:`~trainbus.core.evaluator.Evaluator`
        (label ``"eval"``, ``evaluator.dataloader.dataloader`` is ``eval_dataloader``), or
        none without an ``eval_dataloader``. Read-only: set ``eval_dataloader`` instead.

        Example:
            >>> [e.label for e in state.evaluators]
            ['eval']
        """
        loader = self.eval_dataloader
        cached = self.__dict__.get("_evaluators")
        if cached is None or cached[0] is not loader:
            cached = (loader, evaluators_of(loader))
            self.__dict__["_evaluators"] = cached
        return list(cached[1])

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches trained per epoch, as Composer's ``state.steps_per_epoch``.

        ``len(train_dataloader)`` unless set (``None`` for a loader without a length).
        Assign an int to train only that many batches of each epoch (the loop reads it
        when an epoch starts, so a change from a handler applies from the next epoch);
        a value over the loader's length is capped at it with a warning, as in
        Composer; ``None`` goes back to the whole loader.
        """
        if self._steps_per_epoch is not None:
            return self._steps_per_epoch
        return _loader_len(self.train_dataloader)

    @steps_per_epoch.setter
    def steps_per_epoch(self, value: int | None) -> None:
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"steps_per_epoch={value!r} must be a positive int (batches per epoch), "
                    "or None for the whole train_dataloader"
                )
            length = _loader_len(self.train_dataloader)
            if length is not None and value > length:
                warnings.warn(
                    f"steps_per_epoch={value} is more than the {length} batches of "
                    f"train_dataloader; using {length}",
                    UserWarning,
                    stacklevel=2,
                )
                value = length
        self._steps_per_epoch = value

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers, always a list (assigning one optimizer stores ``[optimizer]``)."""
        optimizers: list[torch.optim.Optimizer] = self._optimizers
        return optimizers

    @optimizers.setter
    def optimizers(
        self, value: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None
    ) -> None:
        self._optimizers[:] = _as_list(value)  # the same list object, as in Composer

    @property
    def schedulers(self) -> list[Any]:
        """The learning-rate schedulers, always a list (one scheduler is stored as ``[it]``)."""
        schedulers: list[Any] = self._schedulers
        return schedulers

    @schedulers.setter
    def schedulers(self, value: Any) -> None:
        self._schedulers[:] = _as_list(value)

    # -- per-batch fields -----------------------------------------------------------------

    def _set_frame(self, name: str, value: Any) -> None:
        self._frame = self._frame.replace(name, value)

    @property
    def timer(self) -> Timer | Timestamp:
        """The run's time counters (in a handler: as of the handler's event)."""
        return self._timer

    @property
    def timestamp(self) -> Timestamp:
        """An immutable snapshot of the counters (in a handler: as of its event)."""
        return self._timer.snapshot()

    def snapshot(self) -> State:
        """Return a view of this state frozen at the current per-batch values.

        The trainer's bus calls this once per published event; the view costs one small
        object and shares everything that is not per-batch with this state.
        """
        return _StateView(self, self._frame, self._timer._ts)

    # -- control ----------------------------------------------------------------------------

    def stop_training(self) -> None:
        """Ask the trainer to stop at the next batch boundary. Safe from any thread."""
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`stop_training` was called since this ``fit()`` began."""
        return self._stop.is_set()

    # -- the training loop's side (the Trainer, trainbus.Bus, a bridge; never a handler) -----

    def begin_fit(self) -> None:
        """Start one fit: forget a stop request left over from the previous one.

        The training loop's owner calls it before a fit's first event (``Trainer.fit()``
        and ``trainbus.Bus`` do).
        """
        self._stop.clear()

    def count_batch(self, samples: int, tokens: int = 0) -> None:
        """Count one finished batch of ``samples`` (and ``tokens``) on the run's timer.

        The training loop calls it just before publishing ``BATCH_END``.
        """
        self._timer.on_batch_complete(samples, tokens)

    def count_epoch(self) -> None:
        """Count one finished epoch; the training loop calls it before ``EPOCH_END``."""
        self._timer.on_epoch_complete()

    def get_elapsed_duration(self) -> Time[float]:
        """The fraction of ``max_duration`` elapsed, as a ``Time`` in ``dur`` units."""
        unit = self.max_duration.unit
        total = float(self.max_duration.value)
        if unit is TimeUnit.DURATION or total <= 0:
            return Time(0.0, TimeUnit.DURATION)
        done = float(self.timestamp.get(unit).value)
        return Time(min(done / total, 1.0), TimeUnit.DURATION)

    # -- serialization ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizers, schedulers, timer (and grad scaler), ready for ``torch.save``."""
        saved: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "schedulers": [sched.state_dict() for sched in self.schedulers],
            "timer": self._timer.state_dict(),
        }
        if self.scaler is not None:
            saved["scaler"] = self.scaler.state_dict()
        return saved

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.model.load_state_dict(state["model"])
        for opt, opt_state in zip(self.optimizers, state.get("optimizers", []), strict=False):
            opt.load_state_dict(opt_state)
        for sched, sched_state in zip(self.schedulers, state.get("schedulers", []), strict=False):
            sched.load_state_dict(sched_state)
        if "timer" in state:
            self._timer.load_state_dict(state["timer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])


class _StateView(State):
    """A handler's view: per-batch fields frozen, everything else the live state's."""

    def __init__(self, live: State, frame: _Frame, timestamp: Timestamp) -> None:
        d = self.__dict__
        d["_live"] = live
        d["_frame"] = frame
        d["_ts"] = timestamp

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not on the view: the live state's fields.
        return getattr(self.__dict__["_live"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_live"], name, value)

    def _set_frame(self, name: str, value: Any) -> None:
        self.__dict__["_live"]._set_frame(name, value)

    @property
    def timer(self) -> Timestamp:
        """The counters as of this handler's event (read-only)."""
        ts: Timestamp = self.__dict__["_ts"]
        return ts

    @property
    def timestamp(self) -> Timestamp:
        """The counters as of this handler's event."""
        ts: Timestamp = self.__dict__["_ts"]
        return ts

    def snapshot(self) -> State:
        """Views are already snapshots."""
        return self

    def begin_fit(self) -> None:
        _not_in_a_handler("begin_fit")

    def count_batch(self, samples: int, tokens: int = 0) -> None:
        _not_in_a_handler("count_batch")

    def count_epoch(self) -> None:
        _not_in_a_handler("count_epoch")


def _not_in_a_handler(name: str) -> None:
    raise RuntimeError(
        f"state.{name}() is the training loop's (the Trainer's, trainbus.Bus's), not a "
        "handler's: a handler sees the state as of its event; to end training call "
        "state.stop_training()"
    )

    def __repr__(self) -> str:
        return f"<State view at {self.__dict__['_ts']!r}>"
