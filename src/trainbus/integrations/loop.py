"""``Bus``: the trainer's bus for a training loop you wrote (or one a library runs).

A :class:`Bus` owns a :class:`~trainbus.State`, a :class:`~trainbus.Logger` and the same
:class:`~trainbus.Engine` that :class:`~trainbus.Trainer` builds; it adds nothing to the
dispatch. ``await bus.run(train)`` runs ``train`` on a new training thread (the engine's
``run_cycle``) while handlers run on the awaiting event loop; ``train`` publishes events
with :meth:`Bus.publish` (or the :meth:`Bus.epoch` and :meth:`Bus.batch` context managers)
and keeps the state in step (``bus.state.loss = ...``). The Lightning and Hugging Face
bridges publish through a ``Bus`` as well (``trainbus.integrations.lightning`` and
``trainbus.integrations.hf``).

Example:
    >>> bus = trainbus.Bus(callbacks=[Upload()], model=model, optimizers=opt)
    >>> def train(bus):
    ...     for inputs, targets in loader:
    ...         with bus.batch((inputs, targets)):
    ...             ...                                 # forward, backward
    ...             bus.publish(Event.AFTER_TRAIN_BATCH)   # gradients complete
    ...             opt.step()
    >>> await bus.run(train, bus)
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

import anyio
import torch

from trainbus.bus.engine import Engine
from trainbus.checkpoint.resume import attach_handler_drain
from trainbus.core.bridge import OWN_LOOP, no_running_loop
from trainbus.core.callback import Callback
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.exceptions import EngineThreadError
from trainbus.core.logger import Logger
from trainbus.core.renamed import renamed_option
from trainbus.core.state import State
from trainbus.core.time import Time
from trainbus.training.batch import batch_size_of
from trainbus.training.checks import check_callbacks

if TYPE_CHECKING:
    from trainbus.bus import BusStatistics

__all__ = ["Bus", "batch_size_of"]

P = ParamSpec("P")
T = TypeVar("T")


class Bus:
    """Trainbus's callbacks, loggers, barriers and statistics for any training loop.

    The training loop runs on a worker thread and publishes Composer's events; handlers
    run exactly as under :class:`~trainbus.Trainer` (``async def`` ones on the event
    loop, plain ones on their callback's thread, ``@blocking`` ones in lockstep, every
    barrier and ``max_lag`` as documented in ``docs/concurrency.md``).

    Args:
        callbacks: :class:`~trainbus.Callback` instances, offered events in this order.
        loggers: :class:`~trainbus.LoggerDestination` instances (offered events last).
        model: The model handlers see as ``state.model`` (assign ``bus.state.model``
            later if it is built inside the loop); an empty module until then.
        optimizers: An optimizer or a list (``state.optimizers``).
        schedulers: A scheduler or a list (``state.schedulers``).
        max_duration: ``state.max_duration`` (``"2ep"``, ``"500ba"``, an int of
            epochs); the loop decides when it stops, this is what callbacks read.
        train_dataloader: ``state.train_dataloader``.
        eval_dataloader: ``state.eval_dataloader``.
        device: ``state.device``.
        run_name: ``state.run_name`` (for loggers).
        barriers: Events at which the training thread waits for every earlier handler.
        max_lag: Batches by which handlers may trail the ``BATCH_END`` barrier.
        queue_size: Handler calls that may wait per callback before training waits.
        warn_slow_callbacks: Warn when a callback's handlers are slower than the batches.
        warn_slow: Deprecated name of ``warn_slow_callbacks`` (warns once).
        wait_warning: Deprecated name of ``wait_warning_seconds`` (warns once).
        close_timeout: Seconds each ``close``/``post_close`` may take before it is
            abandoned (the engine's default when ``None``).
        wait_warning_seconds: Seconds a barrier may wait for a callback before a warning names it
            (the engine's default when ``None``).
        lane_threads: Threads in the pool that runs plain callbacks (the engine's
            default, 8, when ``None``); ``own_thread = True`` callbacks get their own.

    Raises:
        TypeError, ValueError: A callback or an option is invalid (the message names it).

    Example:
        >>> async with trainbus.Bus(callbacks=[Upload()], model=model) as bus:
        ...     await bus.run(train, bus)
        >>> trainbus.Bus(callbacks=[Upload()]).run_sync(train)   # in a script
    """

    def __init__(
        self,
        *,
        callbacks: Sequence[Callback] | Callback = (),
        loggers: Sequence[LoggerDestination] | LoggerDestination = (),
        model: torch.nn.Module | None = None,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        schedulers: Any = None,
        max_duration: Time[Any] | str | int = "1ep",
        train_dataloader: Any = None,
        eval_dataloader: Any = None,
        device: torch.device | str = "cpu",
        run_name: str = "run",
        barriers: Iterable[Event | str] = (Event.BATCH_END,),
        max_lag: int = 0,
        queue_size: int = 128,
        warn_slow_callbacks: bool = True,
        close_timeout: float | None = None,
        wait_warning_seconds: float | None = None,
        lane_threads: int | None = None,
        warn_slow: bool | None = None,
        wait_warning: float | None = None,
    ) -> None:
        callback_list = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
        logger_list = [loggers] if isinstance(loggers, Callback) else list(loggers)
        check_callbacks(callback_list, logger_list)
        for i, dest in enumerate(logger_list):
            if not isinstance(dest, LoggerDestination):
                raise TypeError(
                    f"loggers[{i}] is a {type(dest).__qualname__}, not a LoggerDestination; "
                    "pass plain callbacks in callbacks=[...]"
                )
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module or None, got {type(model).__qualname__}"
            )
        self.state = State(
            model=model if model is not None else torch.nn.Module(),
            max_duration=max_duration,
            optimizers=optimizers,
            schedulers=schedulers,
            train_dataloader=train_dataloader,
            eval_dataloader=eval_dataloader,
            callbacks=[*callback_list, *logger_list],
            device=device,
            run_name=run_name,
        )
        self.logger = Logger(self.state)
        options: dict[str, Any] = {}
        if close_timeout is not None:
            options["close_timeout"] = close_timeout
        wait_warning_seconds = renamed_option(
            "Bus", "wait_warning", wait_warning, "wait_warning_seconds", wait_warning_seconds,
            default=None,
        )
        if wait_warning_seconds is not None:
            options["wait_warning_seconds"] = wait_warning_seconds
        if lane_threads is not None:
            options["lane_threads"] = lane_threads
        self.engine = Engine(
            self.state,
            self.logger,
            self.state.callbacks,
            barriers=barriers,
            max_lag=max_lag,
            queue_size=queue_size,
            warn_slow_callbacks=renamed_option(
                "Bus", "warn_slow", warn_slow, "warn_slow_callbacks", warn_slow_callbacks,
                default=True,
            ),
            **options,
        )
        self._init_published = False
        self._training_thread: int | None = None
        self._publisher: Callable[..., None] | None = None
        # CheckpointSaver drains every queued handler and record before it captures.
        attach_handler_drain(self.state, functools.partial(self.engine.wait_all, records=True))

    # -- running ----------------------------------------------------------------------------

    async def run(self, train: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """Run ``train(*args, **kwargs)`` on a new training thread as one fit cycle.

        Publishes ``INIT`` (on the first run only) and ``FIT_START`` before ``train``,
        ``FIT_END`` after it returns; then every callback's ``close`` and ``post_close``
        run (also when ``train`` or a handler failed, or the awaiting task was
        cancelled). Returns what ``train`` returned, or ``None`` when :meth:`stop` ended
        it before it returned.

        Raises:
            Exception: What ``train`` raised, or a handler's exception (with a note
                naming the callback and event; an ``ExceptionGroup`` if several failed).
            FitInProgressError: This bus is running already.
        """

        def cycle() -> T:
            self._publish_start()
            result = train(*args, **kwargs)
            self.publish(Event.FIT_END)
            return result

        return await self.host(cycle)

    def run_sync(
        self,
        train: Callable[..., T],
        *args: Any,
        backend: Literal["asyncio", "trio"] = "asyncio",
        **kwargs: Any,
    ) -> T | None:
        """:meth:`run` from plain synchronous code (starts an event loop for the handlers).

        Raises:
            EngineThreadError: Called on a thread that runs an event loop; use
                ``await bus.run(train)`` there.
        """
        _refuse_in_loop("bus.run_sync()", "await bus.run(train)")

        async def main() -> T | None:
            OWN_LOOP.set(True)  # this loop is ours: a handler holding it may be interrupted
            return await self.run(train, *args, **kwargs)

        return anyio.run(main, backend=backend)

    async def host(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn()`` on a new training thread as one cycle, publishing nothing itself.

        For a host loop that publishes every event, ``FIT_START`` and ``FIT_END``
        included, from its own hooks (the Lightning and Hugging Face bridges). Every
        callback is closed afterwards, as after :meth:`run`. Returns what ``fn``
        returned, or ``None`` when :meth:`stop` ended it first.
        """
        box: list[T] = []

        def produce() -> None:
            self._publisher = self.engine.publisher()  # this cycle's, bound
            self._training_thread = threading.get_ident()
            try:
                box.append(fn())
            finally:
                self._training_thread = self._publisher = None

        self.state.begin_fit()  # a stop request ends one cycle, as in Trainer.fit()
        await self.engine.run_cycle(produce)  # raises a handler's error, a cancellation
        return box[0] if box else None  # empty: bus.stop() unwound fn at an event

    @property
    def hosting(self) -> bool:
        """Whether the calling thread is the training thread of a :meth:`run`/:meth:`host`."""
        return self._training_thread == threading.get_ident()

    # -- publishing (the training thread) ---------------------------------------------------

    def publish(self, *events: Event | str) -> None:
        """Publish ``events``, in order (on the training thread).

        Events published in one call (nothing computed between them) share one state
        snapshot and wake each callback's lane once. A non-barrier event returns at
        once; at a barrier event this waits for every earlier handler (and runs
        ``@blocking`` handlers before returning). From plain code outside :meth:`run`
        each event's handlers run before this returns (the engine's plain-code mode).

        Raises:
            EngineThreadError: Called from a thread that is not the training thread
                while the bus runs, or on an event loop's thread outside :meth:`run`.
        """
        publish = self._publisher
        if publish is not None and self._training_thread == threading.get_ident():
            for event in events:
                if event.__class__ is not Event:
                    events = tuple(Event(e) for e in events)
                    break
            publish(*events)  # together: one snapshot, each lane woken once
            return
        run_event = self.engine.run_event
        for event in events:
            run_event(event)

    def publish_start(self) -> None:
        """Publish ``INIT`` (the first time only) and ``FIT_START``, for a host's hooks."""
        self._publish_start()

    def _publish_start(self) -> None:
        if not self._init_published:
            self._init_published = True
            self.publish(Event.INIT)
        self.publish(Event.FIT_START)

    def advance_batch(self, samples: int | None = None, tokens: int = 0) -> None:
        """Count one finished batch (``samples`` defaults to ``state.batch_num_samples``).

        Call it just before publishing ``BATCH_END``, as the trainer does.
        """
        state = self.state
        n = state.batch_num_samples if samples is None else samples
        state.count_batch(n, tokens)

    def advance_epoch(self) -> None:
        """Count one finished epoch; call it just before publishing ``EPOCH_END``."""
        self.state.count_epoch()

    @contextlib.contextmanager
    def epoch(self) -> Iterator[None]:
        """Publish ``EPOCH_START`` on entry; on a normal exit count the epoch and publish
        ``EPOCH_END`` and ``EPOCH_CHECKPOINT``. An exception leaves without publishing."""
        self.publish(Event.EPOCH_START)
        yield
        self.advance_epoch()
        self.publish(Event.EPOCH_END, Event.EPOCH_CHECKPOINT)

    @contextlib.contextmanager
    def batch(
        self, batch: Any = None, *, samples: int | None = None, tokens: int = 0
    ) -> Iterator[None]:
        """One training batch: its state and its outer events.

        On entry ``state.batch`` and ``state.batch_num_samples`` (``samples``, else the
        leading dimension of the batch's first tensor) are set and ``AFTER_DATALOADER``,
        ``BATCH_START``, ``BEFORE_TRAIN_BATCH`` published; on a normal exit the batch is
        counted and ``BATCH_END`` (a barrier by default) and ``BATCH_CHECKPOINT``
        published. Publish the events inside the step yourself (``AFTER_BACKWARD``,
        ``AFTER_TRAIN_BATCH`` between backward and the optimizer step, ...).
        """
        state = self.state
        state.batch = batch
        state.batch_num_samples = batch_size_of(batch) if samples is None else samples
        state.batch_num_tokens = tokens
        self.publish(Event.AFTER_DATALOADER, Event.BATCH_START, Event.BEFORE_TRAIN_BATCH)
        yield
        self.advance_batch(tokens=tokens)
        self.publish(Event.BATCH_END, Event.BATCH_CHECKPOINT)

    # -- control and observability ----------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """Whether a callback asked to stop (``state.stop_training()``); check it per batch."""
        return self.state.stop_requested

    def stop(self) -> None:
        """Stop the training thread at its next event (any thread)."""
        self.engine.stop()

    def statistics(self) -> BusStatistics:
        """The engine's statistics (:class:`~trainbus.BusStatistics`)."""
        return self.engine.statistics()

    def close(self) -> None:
        """Close every callback if a plain-code :meth:`publish` left them open."""
        self.engine.close()

    async def aclose(self) -> None:
        """Async twin of :meth:`close`; a no-op after :meth:`run` (which closes)."""
        await self.engine.aclose()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()


def _refuse_in_loop(what: str, alternative: str) -> None:
    """Raise ``EngineThreadError`` if an event loop (asyncio or trio) runs on this thread."""
    if not no_running_loop():
        raise EngineThreadError(
            f"{what} starts its own event loop, but this thread already runs one; "
            f"use `{alternative}` instead"
        )
