"""The Trainer: validated configuration, ``await trainer.fit()`` and ``fit_sync()``."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import anyio
import torch

from trainbus.bus.engine import Engine
from trainbus.bus.options import (
    DEFAULT_CLOSE_TIMEOUT,
    DEFAULT_LANE_THREADS,
    DEFAULT_WAIT_WARNING,
    BusOptions,
)
from trainbus.checkpoint.resume import attach_handler_drain, read_checkpoint, restore_checkpoint
from trainbus.checkpoint.run_start import read_start, start_folder, write_start
from trainbus.core.bridge import OWN_LOOP, LoopHandle, no_running_loop
from trainbus.core.callback import Callback, resolve_callback
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.exceptions import EngineThreadError
from trainbus.core.logger import Logger
from trainbus.core.renamed import renamed_option
from trainbus.core.state import State
from trainbus.core.time import Time
from trainbus.loggers._exactly_once import plan_exactly_once
from trainbus.runtime.distributed import (
    DEFAULT_DIST_TIMEOUT,
    abort_on_failure,
    check_checkpointing,
    is_sharded,
    runs_here,
    setup,
    shard_loader,
    sigterm_stops,
    unwrap,
    wrap_model,
)
from trainbus.runtime.interrupt import sigint_handled
from trainbus.runtime.preemption import (
    HandlerAbandoned,
    Preemption,
    announcers,
    check_preemption,
    launched_by_a_scheduler,
    takes_checkpoints,
)
from trainbus.training.account import FitClock, TimeAccount
from trainbus.training.checks import (
    _as_list,
    _check_loader,
    _default_run_name,
    _optimizer_list,
    _resolve_device,
    check_callbacks,
    check_eval_interval,
    check_grad_clip_norm,
    check_loss,
    check_max_duration,
    check_model,
    check_optimizers,
    check_optimizers_train_the_model,
    check_preempt_deadline,
    check_run_name,
    check_schedulers,
    check_schedulers_step_the_optimizers,
    destinations_first,
    what_callbacks_write,
)
from trainbus.training.fit_call import FitCall
from trainbus.training.loop import LoopConfig, TrainingLoop
from trainbus.training.output import default_output, print_account, progress_on
from trainbus.training.outside_fit import OutsideFit
from trainbus.training.rank_stops import RankStops

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


def _reached(state: State) -> bool:
    """Whether the timer has reached ``state.max_duration``."""
    end = state.max_duration
    return bool(state.timestamp.get(end.unit).value >= end.value)


class Trainer(OutsideFit):
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
        callbacks: :class:`Callback` instances, offered events in this order. A
            :class:`LoggerDestination` here is a destination as in ``loggers`` (and one
            passed in both is registered once).
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
        close_timeout: Seconds each callback's ``close`` and ``post_close`` may take, and
            a cancelled ``fit()`` waits for a stuck handler, before it is reported
            (:class:`~trainbus.CallbackTimeoutWarning`) and abandoned; every other
            callback still closes. ``math.inf`` waits for ever.
        wait_warning_seconds: Seconds the training thread may wait at a barrier (or a
            close for a callback) before a :class:`~trainbus.CallbackTimeoutWarning` names
            the callback and the handler it waits for; ``math.inf`` never warns.
        lane_threads: Threads in the pool that runs plain callbacks' handlers (default
            8): each plain callback is pinned to one of them for the whole run, and
            several share one; a callback that sets ``own_thread = True`` gets a thread
            of its own besides. See ``docs/concurrency.md``.
        load_path: A checkpoint file, or a ``CheckpointSaver`` folder (its newest
            complete checkpoint; an empty folder starts fresh), or ``"s3://bucket/prefix"``
            written by a ``CheckpointUploader``, to resume from. See ``docs/checkpoints.md``.
        dist_timeout: Seconds a collective waits for the other ranks before it fails, when
            the trainer initialises the process group under ``torchrun`` (Composer's
            name). See ``docs/distributed.md``: under ``torchrun`` the model is wrapped in
            ``DistributedDataParallel``, the data sharded, evaluation metrics reduced
            across ranks, and rank-zero-only callbacks act on rank zero only.
        preemption: ``True`` or a :class:`~trainbus.Preemption`: on SIGTERM (while
            ``fit()`` runs in the main thread) save a checkpoint, stop at the next batch,
            close every logger within a grace period, and make ``fit_sync()`` exit with
            status 143. ``None`` (the default) turns it on when the process runs under
            ``torchrun`` or in a SLURM job and a ``CheckpointSaver`` is among the
            callbacks, off otherwise; ``False`` turns it off. :meth:`preempt` works in
            every case. See ``docs/preemption.md``.
        wait_warning: Deprecated name of ``wait_warning_seconds`` (warns once; option
            names follow one rule, ``CONTRIBUTING.md``).
        progress: Show progress (a :class:`~trainbus.callbacks.ProgressBar`, unless one
            is among the callbacks: a bar on a terminal, a line per epoch and per 100
            batches elsewhere), log the time account as ``time/...`` metrics at each
            epoch's end and the fit's, and print the account's table when a fit ends.
            ``None`` (the default): on, unless the environment sets
            ``TRAINBUS_PROGRESS=0`` (for CI); ``False``: none of it.
        track_time: Keep the fit's time account (:attr:`time_account`); ``False`` only
            to measure what it costs (a few clock reads a batch).

    Example:
        >>> trainer = Trainer(model, loader, "2ep", loss_fn=F.cross_entropy,
        ...                   callbacks=[Upload()], loggers=[JSONLinesLogger("m.jsonl")])
        >>> await trainer.fit()          # in async code
        >>> trainer.fit_sync()           # in a script
        >>> trainer.eval_sync(test_loader)  # an evaluation pass outside fit()
        >>> trainer.save_checkpoint("final.pt")
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
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        wait_warning_seconds: float = DEFAULT_WAIT_WARNING,
        lane_threads: int = DEFAULT_LANE_THREADS,
        load_path: str | os.PathLike[str] | None = None,
        dist_timeout: float = DEFAULT_DIST_TIMEOUT,
        preemption: Preemption | bool | None = None,
        wait_warning: float | None = None,
        progress: bool | None = None,
        track_time: bool = True,
    ) -> None:
        check_model(model, train_dataloader)
        model, ddp_wrapper = unwrap(model)  # state.model is the user's module, never DDP
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
        check_loss(model, loss_fn)
        _check_loader(train_dataloader, "train_dataloader")
        if eval_dataloader is not None:
            _check_loader(eval_dataloader, "eval_dataloader")
        duration = check_max_duration(max_duration)
        interval = check_eval_interval(eval_interval)
        check_run_name(run_name)
        clip = check_grad_clip_norm(grad_clip_norm)
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
            warn_slow=warn_slow_callbacks,
            close_timeout=close_timeout,
            wait_warning=renamed_option(
                "Trainer", "wait_warning", wait_warning, "wait_warning_seconds",
                wait_warning_seconds, default=DEFAULT_WAIT_WARNING,
            ),
            lane_threads=lane_threads,
        )
        resolved_device = _resolve_device(device)
        callbacks = _as_list(callbacks, "callbacks")
        loggers = _as_list(loggers, "loggers")
        check_callbacks(callbacks, loggers)
        callbacks, loggers = destinations_first(callbacks, loggers)
        self._progress = progress_on(progress)
        if not isinstance(track_time, bool):
            raise TypeError(f"track_time={track_time!r} must be True or False")
        self._track_time = track_time
        self._clock: FitClock | None = None
        output = default_output(
            [*callbacks, *loggers], progress=self._progress, track_time=track_time,
            account=lambda: self.time_account,
        )
        self.preemption = check_preemption(
            preemption,
            auto=launched_by_a_scheduler() and takes_checkpoints([*callbacks, *loggers]),
        )
        # trainer.preempt() gives the same notice with or without signals handled.
        self._notices = self.preemption or Preemption(signals=())
        check_checkpointing(model, callbacks)
        sched_list = check_schedulers(schedulers)
        opt_list = [] if optimizers is None else _optimizer_list(optimizers)
        check_optimizers(opt_list)
        check_optimizers_train_the_model(opt_list, model)
        check_schedulers_step_the_optimizers(sched_list, opt_list)
        for i, dest in enumerate(loggers):
            if not isinstance(dest, LoggerDestination):
                resolve_callback(dest, where=f"loggers[{i}]")  # raises for non-callbacks
                raise TypeError(
                    f"loggers[{i}] is a {type(dest).__qualname__}, not a LoggerDestination; "
                    "pass plain callbacks in callbacks=[...]"
                )
        dist_info, resolved_device = setup(resolved_device, dist_timeout)
        train_dataloader = shard_loader(
            train_dataloader, dist_info, name="train_dataloader", seed=seed or 0
        )
        if eval_dataloader is not None:
            eval_dataloader = shard_loader(
                eval_dataloader, dist_info, name="eval_dataloader", seed=seed or 0
            )

        if seed is not None:
            random.seed(seed)
            torch.manual_seed(seed)
        model.to(resolved_device)
        ddp_model = wrap_model(model, ddp_wrapper, dist_info, resolved_device)
        if not opt_list:
            opt_list = [torch.optim.AdamW(model.parameters(), lr=1e-3)]
        self.state = State(
            model=model,
            max_duration=duration,
            optimizers=opt_list,
            schedulers=sched_list,
            train_dataloader=train_dataloader,
            eval_dataloader=eval_dataloader,
            precision=precision or "fp32",
            grad_accum=grad_accum,
            callbacks=[*callbacks, *loggers, *output],
            device=resolved_device,
            run_name=run_name or _default_run_name(),
        )
        self.state.ddp_model = ddp_model
        self.state.rank, self.state.world_size = dist_info.rank, dist_info.world_size
        self.state.local_rank = dist_info.local_rank
        self._distributed = dist_info.distributed
        self._rank_stops = (  # its agreement: each fit()'s, made on its training thread
            RankStops(dist_info, self.state, self._notices) if dist_info.distributed else None
        )
        sources = announcers(self.state.callbacks)  # RayReporter: Ray's drain notice
        self._poll_notices = (
            functools.partial(self._notices.poll, self.state, sources) if sources else None
        )
        if _PRECISIONS[precision] is torch.float16:  # bf16 has fp32's range: no scaler
            self.state.scaler = torch.amp.GradScaler(resolved_device.type)
        self.logger = Logger(self.state)
        if self._rank_stops is not None:  # rank zero logs the ranks' step times through it
            self._rank_stops.logger = self.logger
        self.engine = Engine(
            self.state,
            self.logger,
            [
                cb
                for cb in self.state.callbacks
                if runs_here(cb, dist_info, sharded=is_sharded(model))
            ],
            options=bus_options,
        )
        self._config = LoopConfig(
            loss_fn=loss_fn,
            eval_interval=interval,
            autocast_dtype=_PRECISIONS[precision],
            log_train_loss=log_train_loss and bool(loggers),
            grad_clip_norm=clip,
        )
        self._close_timeout = bus_options.close_timeout  # preemption's patience too
        self._init_delivered = False
        self._finished = False  # whether a fit() of this trainer reached max_duration
        self._notice_acted = False  # whether a fit() ran with state.preemption set
        # Read and check the checkpoint before INIT; restore it after, as Composer does.
        writes = what_callbacks_write(load_path, self.state.callbacks)
        checkpoint = None if load_path is None else read_checkpoint(load_path, self.state, **writes)
        # Before the first checkpoint, the saver's folder holds the run's start: a restart
        # resumes its destinations from it (checkpoint/run_start.py, rank zero only).
        folder = None if checkpoint is not None or self.state.rank != 0 else (
            start_folder(load_path, writes["saver_folders"])
        )  # fmt: skip
        restart = None if folder is None else read_start(folder)
        # Before anything is logged or restored: destinations choose their exactly-once path.
        resumed = checkpoint is not None or restart is not None
        plan_exactly_once(self.state.callbacks, resumed=resumed)
        if folder is not None and restart is None:
            write_start(folder, self.state.callbacks)  # before anything is logged
        if no_running_loop():  # as Composer does: INIT handlers run in the constructor
            anyio.run(self.engine.arun_event, Event.INIT)
            self._init_delivered = True
        if checkpoint is not None:
            restore_checkpoint(checkpoint, self.state)
        elif restart is not None:
            restart.restore(self.state.callbacks)

    def fit(self, *, duration: Time[Any] | str | int | None = None) -> FitCall:
        """Train until ``max_duration`` (or for ``duration`` more), then close callbacks.

        Await it: ``await trainer.fit()`` (``trainer.fit_sync()`` in a script). It returns
        a :class:`~trainbus.training.fit_call.FitCall`, a coroutine that trains when
        awaited; one dropped without being awaited (``trainer.fit()`` called the Composer
        way) issues a :class:`~trainbus.FitNotAwaitedWarning` at once, naming the line.

        The training loop runs on a worker thread; handlers run on this event loop and
        on their callbacks' threads. Returns when training ended and every callback's
        ``close`` and ``post_close`` have run; raises a handler's exception (with a note
        naming the callback and event), or an ``ExceptionGroup`` if several failed.
        Cancelling the awaiting task stops training within one event and still closes.

        Args:
            duration: Train this much longer than the timer says now (continues a
                finished run), instead of up to ``max_duration``.

        Raises:
            RuntimeError: The last ``fit()`` reached ``max_duration`` and no ``duration``
                is given: there is nothing left to train (pass ``duration=``).
        """
        return FitCall(functools.partial(self._fit, duration))

    async def _fit(self, duration: Time[Any] | str | int | None) -> None:
        state = self.state
        self.engine._refuse_while_running()  # before anything changes
        if duration is not None:
            extra = check_max_duration(duration, name="duration")
            now = state.timestamp.get(extra.unit)
            state.max_duration = Time(int(now.value) + int(extra.value), extra.unit)
        elif self._finished and _reached(state):
            end = state.max_duration
            raise RuntimeError(
                f"fit() has nothing left to train: the last fit() reached max_duration="
                f"'{end.value}{end.unit.value}'; to continue the run, pass duration=..., e.g. "
                "trainer.fit(duration='1ep') (or fit_sync(duration='1ep'))"
            )
        if self._notice_acted:  # the last fit() stopped for it: this one starts afresh
            state.preemption = None
            self._notice_acted = False
        state.begin_fit()
        rank_stops = self._rank_stops
        loop = TrainingLoop(
            state, self.logger, self._config, rank_stops, self._poll_notices,
            rank_stops.timed if rank_stops is not None else None,
        )
        clock = self._clock = (
            FitClock.for_fit(state, self.engine.statistics) if self._track_time else None
        )
        loop.clock = clock
        # The saver waits for every handler and record before it captures (CheckpointSaver).
        drain = functools.partial(self.engine.wait_all, records=True)
        attach_handler_drain(state, drain if clock is None else clock.timed_drain(drain))
        deliver_init = not self._init_delivered
        self._init_delivered = True

        notices = self._notices

        def produce() -> None:
            publish = self.engine.publisher()  # this cycle's
            loop.bind(publish if clock is None else clock.timed(publish))
            if rank_stops is not None:
                rank_stops.open()  # a collective: every rank's training thread, here
            try:
                loop.run(deliver_init=deliver_init)
                notices.loop_ended(state)  # a notice's checkpoint still due: written now
            except BaseException:
                if clock is not None:
                    clock.loop_ended()
                if rank_stops is not None:
                    rank_stops.close(ended=False)
                if self._distributed:  # peers waiting in a collective fail now, not later
                    abort_on_failure()
                raise
            if clock is not None:
                clock.loop_ended()
            if rank_stops is not None:
                rank_stops.close(ended=True)

        with (
            notices.installed(
                state, self.engine, self._close_timeout, distributed=self._distributed
            ),
            sigterm_stops(state, self._distributed and self.preemption is None) as terminated,
        ):
            try:
                await self.engine.run_cycle(produce)
            except Exception as exc:
                if state.preemption is None or not _only_abandoned(exc):
                    raise  # a handler freed by preemption's watchdog fails, as meant
            finally:
                self._notice_acted = state.preemption is not None
                if clock is not None:
                    clock.end()
        if clock is not None and self._progress and state.rank == 0:
            print_account(clock.account(), state.callbacks)
        self._finished = _reached(state)  # a later fit() without duration= would do nothing
        if rank_stops is not None and rank_stops.peer_failed:
            raise RuntimeError(
                f"fit() stopped on rank {state.rank} after batch {rank_stops.stopped_at}: "
                "another rank's callback failed, and every rank stopped at the same batch "
                "(see that rank's error)"
            )
        if terminated:  # torchrun stops the other workers when one fails; all closed
            raise RuntimeError(
                f"fit() stopped on rank {state.rank}: the process received SIGTERM (torchrun "
                "sends it to every worker once one has failed; see that worker's error)"
            )

    @property
    def time_account(self) -> TimeAccount | None:
        """Where the running or last ``fit()``'s wall time went (``None`` before the first
        fit, or with ``track_time=False``): a :class:`~trainbus.TimeAccount`, live while
        the fit runs. See ``docs/where-the-time-went.md``."""
        clock = self._clock
        return clock.account() if clock is not None else None

    @property
    def preempted(self) -> bool:
        """Whether a preemption notice (a signal, :meth:`preempt`, another rank) came for
        the running or last ``fit()``; ``state.preemption`` is that notice."""
        return self.state.preemption is not None

    def preempt(
        self, reason: str, deadline: float | None = None, *, timeout: float | None = None
    ) -> bool:
        """Tell the run that it will be stopped: the same notice as a preemption signal.

        Safe from any thread and from any task (a web request, a spot-notice poller, a Ray
        callback); returns at once. ``state.preemption`` becomes the notice, each
        callback's ``async def preemption_notice(state, logger)`` starts on the loop, the
        run stops at the next batch boundary (under ``torchrun``: every rank, one batch
        later) with a checkpoint, and closes before ``deadline``; ``fit_sync()`` then
        raises :class:`~trainbus.TrainingPreempted` (``await fit()`` returns and
        :attr:`preempted` is true). Unlike a signal's, this notice never ends the process
        when the deadline passes. Called before ``fit()``, the next ``fit()`` stops at its
        first batch boundary.

        Args:
            reason: Why, for ``state.preemption.reason`` and the stderr line,
                e.g. ``"maintenance"``.
            deadline: A :func:`time.monotonic` value (not seconds from now: see
                ``timeout``) by which the run must have stopped; default: the preemption's
                grace period from now (``Preemption(grace=...)``, else the environment's,
                else 30 s). From a wall-clock deadline ``t``:
                ``time.monotonic() + (t - time.time())``.
            timeout: The same deadline as seconds from now, e.g. ``timeout=60``.

        Returns:
            Whether this call gave the notice (``False``: a notice was already given).

        Example:
            >>> trainer.preempt("maintenance")   # from a request handler, say
            True
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(
                f"reason={reason!r} must be a non-empty string saying why, e.g. "
                'trainer.preempt("maintenance")'
            )
        deadline = check_preempt_deadline(deadline, timeout)
        notices = self._notices
        return notices.give(self.state, notices.notice(reason, deadline=deadline))

    def fit_sync(
        self,
        *,
        duration: Time[Any] | str | int | None = None,
        backend: Literal["asyncio", "trio"] = "asyncio",
    ) -> None:
        """Run :meth:`fit` from plain synchronous code (starts an event loop).

        Ctrl-C (on the main thread) stops training at the next event and closes every
        callback, then raises ``KeyboardInterrupt``; a second Ctrl-C gives what still runs
        2 s more, abandons what is stuck after them, and closes the rest under the same
        short deadline.

        Raises:
            EngineThreadError: Called on a thread that runs an event loop; use
                ``await trainer.fit()`` there.
            KeyboardInterrupt: Ctrl-C was pressed (after every callback closed).
            TrainingPreempted: A preemption notice stopped the run (a signal,
                :meth:`preempt`, another rank); a ``SystemExit`` with the configured
                status.
        """
        if not no_running_loop():
            raise EngineThreadError(
                "fit_sync() starts its own event loop, but this thread already runs one; "
                "use `await trainer.fit()` instead"
            )
        running: list[tuple[LoopHandle, anyio.CancelScope]] = []

        async def fit() -> None:
            OWN_LOOP.set(True)  # this loop is ours: a handler holding it may be interrupted
            with anyio.CancelScope() as scope:
                running.append((LoopHandle(), scope))
                await self.fit(duration=duration)

        def cancel() -> None:  # from the SIGINT handler: cancel on the loop
            for loop, scope in running:
                loop.call_soon(scope.cancel)

        with sigint_handled(self.engine, cancel) as presses:
            anyio.run(fit, backend=backend)
        self._notices.raise_if_triggered(self.state)  # exits with its status unless caught
        if presses is not None and presses.count:
            raise KeyboardInterrupt


def _only_abandoned(exc: BaseException) -> bool:
    """Whether ``exc`` is (a group of) :class:`HandlerAbandoned` only."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_abandoned(e) for e in exc.exceptions)
    return isinstance(exc, HandlerAbandoned)
