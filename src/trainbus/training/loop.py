"""The training loop body: what runs on the training thread during ``fit()``.

It knows nothing about threads or event loops: it computes, updates the state, and
calls ``publish(event)`` at each point of Composer's event order (SPEC section 2).
``publish`` may block (barriers, backpressure) or raise to unwind (errors, cancellation).
The step is Composer v0.6's: gradients zeroed after ``BEFORE_TRAIN_BATCH``, unscaled and
clipped before ``AFTER_TRAIN_BATCH``, applied after it (``docs/training-loop.md``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainbus.checkpoint.resume import epoch_batches
from trainbus.core.events import Event
from trainbus.core.exceptions import Stopped
from trainbus.core.logger import LogLevel
from trainbus.core.scalars import DeferredScalar
from trainbus.core.time import Time, TimeUnit
from trainbus.runtime.distributed import reduce_eval, sync_gradients
from trainbus.training.batch import BatchCalls, batch_size_of

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State
    from trainbus.training.account import FitClock

__all__ = ["LoopConfig", "TrainingLoop"]

E = Event


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """What the loop needs besides the state; built and validated by the Trainer."""

    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    eval_interval: Time[int]
    autocast_dtype: torch.dtype | None
    log_train_loss: bool
    grad_clip_norm: float | None = None


def _unbound(*events: Event) -> None:
    raise RuntimeError("TrainingLoop.bind(publish) must be called before run()")


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in ``batch`` to ``device`` without blocking the host."""
    if isinstance(batch, torch.Tensor):
        # Already there (CPU training): ``to`` would return it too, at a dispatch's cost.
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(v, device) for v in batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    return batch


def split_microbatches(batch: Any, n: int) -> list[Any]:
    """Split ``batch`` into ``n`` microbatches along the leading dimension."""
    if n == 1:
        return [batch]
    if isinstance(batch, torch.Tensor):
        return list(torch.chunk(batch, n))
    if isinstance(batch, Mapping):
        parts = {k: split_microbatches(v, n) for k, v in batch.items()}
        count = min(len(p) for p in parts.values())
        return [type(batch)({k: p[i] for k, p in parts.items()}) for i in range(count)]  # type: ignore[call-arg]
    if isinstance(batch, tuple | list):
        columns = [split_microbatches(v, n) for v in batch]
        count = min(len(c) for c in columns)
        return [type(batch)(c[i] for c in columns) for i in range(count)]
    raise TypeError(
        f"grad_accum={n} needs batches of tensors, tuples, lists or dicts to split, "
        f"got {type(batch).__qualname__}; use grad_accum=1"
    )


def _len_or_none(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class TrainingLoop:
    """Runs epochs of training (and evaluation) on the calling thread."""

    def __init__(
        self,
        state: State,
        logger: Logger,
        config: LoopConfig,
        rank_stops: Callable[[bool, bool], bool] | None = None,
        poll_notices: Callable[[], None] | None = None,
        rank_times: Callable[[float], None] | None = None,
    ) -> None:
        self.state = state
        self.logger = logger
        self.config = config
        #: This cycle's publish, set by :meth:`bind` before :meth:`run`.
        self.publish: Callable[..., None] = _unbound
        #: Distributed: ``rank_stops(failed, last)`` at each batch boundary says whether
        #: every rank stops here (``training/rank_stops.py``); a failed publish is held.
        self.rank_stops = rank_stops
        #: With a callback that announces preemptions (``RayReporter``: Ray's drain notice):
        #: ``poll_notices()`` at each batch boundary, before the stop is decided, gives the
        #: notice it announced (``Preemption.poll``).
        self.poll_notices = poll_notices
        #: Distributed: ``rank_times(fetched)`` at each batch boundary, with the time its
        #: batch came out of the loader (``runtime/rank_times.py``).
        self.rank_times = rank_times
        self._stopped = False  # every rank agreed to stop
        self._held: Exception | None = None  # a failed publish, raised once all stopped
        #: The held publish is the bus stopped for a preemption, not a failure (``bind``).
        self.silenced = False
        self.model = state.model
        self.calls = BatchCalls(state.model, config.loss_fn)
        # Training goes through the DDP wrapper (state.ddp_model is state.model without one).
        self.train_calls = BatchCalls(state.model, config.loss_fn, module=state.ddp_model)
        #: The fit's time account clock (``training/account.py``): told at phase boundaries.
        self.clock: FitClock | None = None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = self.config.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.state.device.type, dtype=dtype)

    def _forward_loss(self, micro: Any) -> torch.Tensor:
        """Forward and loss of one microbatch, with their events.

        Events with nothing computed between them are published together: they share
        one state snapshot and wake each lane once.
        """
        publish, state = self.publish, self.state
        publish(E.BEFORE_FORWARD)
        with self._autocast():
            outputs = self.train_calls.forward(micro)
        state.outputs = outputs
        publish(E.AFTER_FORWARD, E.BEFORE_LOSS)
        with self._autocast():
            loss = self.calls.loss(outputs, micro)
        # Handlers get the loss without its graph: float(state.loss) just works, and the
        # host copy of a GPU loss starts here, on the training thread (D14).
        state.loss = DeferredScalar.start(loss.detach())
        publish(E.AFTER_LOSS, E.BEFORE_BACKWARD)
        return loss

    def _train_batch(self, batch: Any, lead: tuple[Event, ...]) -> torch.Tensor:
        """One step, in Composer v0.6's order; returns the batch's (detached) loss.

        ``lead`` ends with ``BEFORE_TRAIN_BATCH``; then the gradients are zeroed, the
        microbatches run forward, loss and backward (scaled by the grad scaler, if any),
        the gradients are unscaled and clipped, ``AFTER_TRAIN_BATCH`` sees them complete
        and not yet applied, and only then do the optimizers and schedulers step.
        """
        state, publish = self.state, self.publish
        publish(*lead)
        for opt in state.optimizers:
            opt.zero_grad(set_to_none=True)
        scaler = state.scaler
        total = state.batch_num_samples
        micro_losses = []
        micros = split_microbatches(batch, state.grad_accum)
        for i, micro in enumerate(micros):
            with sync_gradients(state.ddp_model, last=i == len(micros) - 1):  # DDP: once
                loss = self._forward_loss(micro)
                if len(micros) == 1:
                    micro_losses.append(state.loss)  # already detached
                else:
                    loss = loss * (batch_size_of(micro) / total if total else 1.0)
                    micro_losses.append(loss.detach())
                if scaler is not None:
                    loss = scaler.scale(loss)  # fp16: small gradients do not underflow
                loss.backward()  # type: ignore[no-untyped-call]
            publish(E.AFTER_BACKWARD)
        if scaler is not None:
            for opt in state.optimizers:
                scaler.unscale_(opt)
        if self.config.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
        publish(E.AFTER_TRAIN_BATCH)
        for opt in state.optimizers:
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)  # skipped when the unscaled gradients hold inf or nan
        if scaler is not None:
            scaler.update()
        for sched in state.schedulers:
            sched.step()
        return micro_losses[0] if len(micro_losses) == 1 else torch.stack(micro_losses).sum()

    def bind(self, publish: Callable[..., None]) -> None:
        """Publish through ``publish`` (this cycle's). In a distributed run a publish that
        fails (a handler's error, a cancellation: the bus stopped) is held: this rank goes on
        computing, without events, until every rank agreed to stop (peers would otherwise
        wait for its gradients), then :meth:`run` raises it."""
        if self.rank_stops is None:
            self.publish = publish
            return

        def holding(*events: Event) -> None:
            if self._held is not None:
                return
            try:
                publish(*events)
            except Exception as exc:
                self._held = exc
                # The preemption's watchdog stopped this rank's bus (a stuck handler was
                # abandoned): no failure of the run, only no more events here.
                self.silenced = isinstance(exc, Stopped) and self.state.preemption is not None

        self.publish = holding

    def _reached(self) -> bool:
        end = self.state.max_duration
        return bool(self.state.timestamp.get(end.unit).value >= end.value)

    def _done(self) -> bool:
        if self.rank_stops is not None:
            return self._stopped or self._reached()
        return self.state.stop_requested or self._reached()

    def _boundary(self) -> bool:
        """After a batch: whether training stops here (every rank agrees, distributed)."""
        if self.poll_notices is not None and self.state.preemption is None:
            self.poll_notices()
        if self.rank_stops is None:
            return self._done()
        reached = self._reached()
        if not self._stopped:
            failed = self._held is not None and not self.silenced
            self._stopped = self.rank_stops(failed, reached)
        return self._stopped or reached

    def _eval_due(self, unit: TimeUnit) -> bool:
        interval = self.config.eval_interval
        if self.state.eval_dataloader is None or interval.unit is not unit:
            return False
        return int(self.state.timestamp.get(unit)) % int(interval.value) == 0

    def run(self, *, deliver_init: bool) -> None:
        """Train until ``state.max_duration`` or a stop request; publish every event."""
        state, publish = self.state, self.publish
        state.ddp_model.train()  # the user's module, and its DDP wrapper if any
        if deliver_init:
            publish(E.INIT)
        publish(E.FIT_START)
        while not self._done():
            skip = int(state.timestamp.batch_in_epoch)
            if skip == 0:
                publish(E.EPOCH_START)
            finished_epoch = self._run_epoch(skip)
            if not finished_epoch:
                break
            state.count_epoch()
            publish(E.EPOCH_END)
            if self._eval_due(TimeUnit.EPOCH):
                self.evaluate()
            publish(E.EPOCH_CHECKPOINT)
        publish(E.FIT_END)
        if self._held is not None:
            raise self._held

    def _run_epoch(self, skip: int) -> bool:
        """One epoch (or its rest); returns whether it ran to the end of the data."""
        state, publish, logger = self.state, self.publish, self.logger
        device = state.device
        batches: Iterator[Any] = epoch_batches(state, skip)  # set_epoch, resume position
        seen = skip
        num_batches = _len_or_none(state.train_dataloader)
        limit = state.steps_per_epoch  # Composer's: read once an epoch
        if limit is not None and limit != num_batches:
            if seen >= limit:  # resumed at the end of a shortened epoch
                return True
            batches = itertools.islice(batches, limit - seen)
            num_batches = limit
        clock = self.clock
        rank_times = self.rank_times
        if clock is not None:
            clock.fetching()
        for raw in batches:
            fetched = time.perf_counter() if rank_times is not None else 0.0
            if clock is not None:
                clock.fetched()
            seen += 1
            self.calls.check(raw, "train_dataloader")
            batch = to_device(raw, device)
            state.batch = batch
            state.batch_num_samples = batch_size_of(batch)
            loss = self._train_batch(
                batch, (E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH)
            )
            state.count_batch(state.batch_num_samples, state.batch_num_tokens)
            if self.config.log_train_loss:  # at step n for batch n, as BATCH_END handlers
                logger.log_metrics({"loss/train": DeferredScalar.start(loss)})
            # Composer's order: BATCH_CHECKPOINT after BATCH_END and any batch-wise
            # evaluation, so a checkpoint taken there holds the evaluation's results and a
            # run resumed from it does not miss that evaluation.
            if self._eval_due(TimeUnit.BATCH):
                publish(E.BATCH_END)
                self.evaluate()
                publish(E.BATCH_CHECKPOINT)
            else:
                publish(E.BATCH_END, E.BATCH_CHECKPOINT)
            if clock is not None:
                clock.batch_done()
            if rank_times is not None:
                rank_times(fetched)
            if self._boundary():
                # The data ran out with this batch: the epoch is complete (EPOCH_END
                # fires), as when max_duration in batches is a whole number of epochs.
                return seen == num_batches
        if seen == 0:
            raise ValueError(
                "train_dataloader produced no batches; check the dataset and drop_last"
            )
        return True

    @torch.no_grad()
    def evaluate(self, dataloader: Any = None) -> None:
        """One pass over ``dataloader`` (default ``eval_dataloader``): mean loss and model
        metrics, logged."""
        state, publish = self.state, self.publish
        loader = state.eval_dataloader if dataloader is None else dataloader
        clock = self.clock
        back = clock.evaluating() if clock is not None else 0
        model = self.model
        model.eval()
        publish(E.EVAL_START)
        total = 0
        sums: dict[str, torch.Tensor] = {}
        metric_fn = getattr(model, "eval_metrics", None)
        where = "eval_dataloader" if dataloader is None else "dataloader"
        for raw in loader:
            self.calls.check(raw, where)
            batch = to_device(raw, state.device)
            n = batch_size_of(batch)
            state.batch = batch
            publish(E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD)
            with self._autocast():
                outputs = self.calls.forward(batch)
            state.outputs = outputs
            publish(E.EVAL_AFTER_FORWARD)
            with self._autocast():
                loss = self.calls.loss(outputs, batch)
            values: dict[str, Any] = {"loss": loss}
            if callable(metric_fn):
                values.update(metric_fn(outputs, batch))
            for name, value in values.items():
                v = torch.as_tensor(value, device=state.device).detach().float() * n
                sums[name] = sums[name] + v if name in sums else v
            total += n
            publish(E.EVAL_BATCH_END)
        sums, count = reduce_eval(sums, total, state.device)  # under torchrun: all ranks
        divisor = count.clamp(min=1) if isinstance(count, torch.Tensor) else max(count, 1)
        means = {name: DeferredScalar.start(s / divisor) for name, s in sums.items()}
        metrics = dict(state.current_metrics)
        metrics["eval"] = means
        state.current_metrics = metrics
        model.train()
        self.logger.log_metrics(
            {f"eval/{name}": value for name, value in means.items()}, level=LogLevel.EPOCH
        )
        publish(E.EVAL_END)
        if clock is not None:
            clock.evaluated(back)
