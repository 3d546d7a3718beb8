"""trainbus callbacks and loggers under PyTorch Lightning's ``Trainer`` (``trainbus[lightning]``).

:class:`TrainbusCallback` is a Lightning ``Callback`` that publishes Composer's events
from Lightning's hooks on a :class:`~trainbus.Bus`, with the state filled from Lightning's
trainer and module; :meth:`TrainbusCallback.fit` runs the fit on a worker thread so that
the bus's handlers run on the awaiting event loop. Lightning's own callbacks and loggers
keep working beside it, and what Lightning logs (``self.log(...)``) reaches the trainbus
loggers through :attr:`TrainbusCallback.lightning_logger`. The mapping, hook by hook, is
a table in ``docs/integrations.md``.

Example:
    >>> bridge = TrainbusCallback(callbacks=[Upload()], loggers=[InMemoryLogger()])
    >>> trainer = pl.Trainer(max_epochs=2, callbacks=[bridge])
    >>> await bridge.fit(trainer, module, train_loader)   # in async code
    >>> bridge.fit_sync(trainer, module, train_loader)    # in a script
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack

import anyio
import pytorch_lightning as pl
from pytorch_lightning.loggers import Logger as LightningLogger
from pytorch_lightning.trainer.states import TrainerFn

from trainbus.core.callback import Callback
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.time import Time
from trainbus.integrations._hosting import BusKeywords, start_hosted
from trainbus.integrations.loop import Bus, _refuse_in_loop, batch_size_of

__all__ = ["TrainbusCallback", "TrainbusLightningLogger"]

E = Event


def _skip_validation(trainer: pl.Trainer) -> bool:
    """Lightning's sanity check, or ``trainer.validate()`` outside a fit: not published."""
    return bool(trainer.sanity_checking) or trainer.state.fn != TrainerFn.FITTING


def _precision(value: Any) -> str:
    text = str(value)
    if text.startswith("bf16"):
        return "bf16"
    if text.startswith("16"):
        return "fp16"
    return "fp32"


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """Hyperparameters with str keys and scalar values (other values as their ``repr``)."""
    return {
        str(k): v if isinstance(v, int | float | str | bool) or v is None else repr(v)
        for k, v in params.items()
    }


class TrainbusLightningLogger(LightningLogger):
    """A Lightning logger that hands what Lightning logs to the bus's loggers.

    Lightning calls it as it calls its other loggers (every ``log_every_n_steps`` for
    ``on_step`` values, at epoch and validation ends for the rest); each call becomes one
    record, with the trainbus batch count as its step (``bus.logger.log_metrics``).
    """

    def __init__(self, bus: Bus) -> None:
        super().__init__()
        self._bus = bus

    @property
    def name(self) -> str:
        return "trainbus"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._bus.logger.log_metrics(dict(metrics))

    def log_hyperparams(
        self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        values = vars(params) if isinstance(params, Namespace) else params
        self._bus.logger.log_hyperparameters(_plain(values))


class TrainbusCallback(pl.Callback):
    """Runs trainbus callbacks and loggers on the bus during a Lightning fit.

    Pass it in ``pl.Trainer(callbacks=[...])`` and start the fit with :meth:`fit` (async)
    or :meth:`fit_sync`: the fit runs on a worker thread, the handlers on the event loop
    (``async def``), on their callbacks' threads (plain) or in lockstep (``@blocking``),
    with barriers and ``max_lag`` as under :class:`~trainbus.Trainer`. Called as plain
    ``trainer.fit(...)`` it still works, but each event's handlers then run before
    Lightning continues (nothing overlaps), as in Composer.

    Args:
        callbacks: trainbus :class:`~trainbus.Callback` instances.
        loggers: trainbus :class:`~trainbus.LoggerDestination` instances.
        log_lightning_metrics: Forward what Lightning logs to ``loggers``: the
            :attr:`lightning_logger` is appended to the trainer's loggers at ``setup``
            when the trainer has loggers (appended last, so Lightning's first logger
            still names the checkpoint folder). With ``logger=False`` pass
            ``logger=bridge.lightning_logger`` to the trainer instead.
        run_name: ``state.run_name``.
        **bus_options: ``barriers``, ``max_lag``, ``queue_size``, ``warn_slow_callbacks``,
            ``close_timeout``, ``wait_warning_seconds``: as for :class:`~trainbus.Bus`, handed to it
            unchanged.

    Attributes:
        bus: The :class:`~trainbus.Bus` (``bus.state``, ``bus.statistics()``).
        lightning_logger: The Lightning logger that forwards Lightning's metrics.
    """

    def __init__(
        self,
        callbacks: Sequence[Callback] | Callback = (),
        loggers: Sequence[LoggerDestination] | LoggerDestination = (),
        *,
        log_lightning_metrics: bool = True,
        run_name: str = "lightning",
        **bus_options: Unpack[BusKeywords],
    ) -> None:
        super().__init__()
        self.bus = Bus(
            callbacks=callbacks,
            loggers=loggers,
            run_name=run_name,
            **bus_options,
        )
        self.lightning_logger = TrainbusLightningLogger(self.bus)
        self._log_lightning_metrics = log_lightning_metrics
        self._direct = False

    # -- starting a fit ---------------------------------------------------------------------

    async def fit(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        """``trainer.fit(*args, **kwargs)`` on a worker thread, the bus on this loop.

        Returns when the fit ended and every trainbus callback's ``close`` and
        ``post_close`` have run. Raises what the fit or a handler raised; cancelling the
        awaiting task stops the fit at its next hook.

        Raises:
            ValueError: This callback is not in ``trainer.callbacks``.
        """
        if not any(cb is self for cb in getattr(trainer, "callbacks", ())):
            raise ValueError(
                "this TrainbusCallback is not in trainer.callbacks; build the trainer with "
                "pl.Trainer(callbacks=[bridge, ...])"
            )
        await self.bus.host(lambda: trainer.fit(*args, **kwargs))

    def fit_sync(
        self,
        trainer: pl.Trainer,
        *args: Any,
        backend: Literal["asyncio", "trio"] = "asyncio",
        **kwargs: Any,
    ) -> None:
        """:meth:`fit` from plain synchronous code (starts an event loop for the handlers)."""
        _refuse_in_loop("bridge.fit_sync()", "await bridge.fit(trainer, ...)")

        async def main() -> None:
            await self.fit(trainer, *args, **kwargs)

        anyio.run(main, backend=backend)

    # -- the state --------------------------------------------------------------------------

    def _fill(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = self.bus.state
        state.model = pl_module
        state.optimizers = list(trainer.optimizers)
        state.schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        state.device = pl_module.device
        state.precision = _precision(trainer.precision)
        state.grad_accum = int(trainer.accumulate_grad_batches)
        state.rank, state.world_size = int(trainer.global_rank), int(trainer.world_size)
        state.local_rank = int(trainer.local_rank)
        if trainer.max_steps is not None and trainer.max_steps > 0:
            state.max_duration = Time(int(trainer.max_steps), "ba")
        elif trainer.max_epochs is not None and trainer.max_epochs > 0:
            state.max_duration = Time(int(trainer.max_epochs), "ep")

    # -- Lightning's hooks ------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.bus.state.model = pl_module
        forwarder = self.lightning_logger
        if (
            self._log_lightning_metrics
            and trainer.loggers
            and not any(lg is forwarder for lg in trainer.loggers)
        ):
            trainer.loggers = [*trainer.loggers, forwarder]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fill(trainer, pl_module)
        self._direct = start_hosted(
            self.bus, call="trainer.fit()", alternative="await bridge.fit(trainer, model, ...)"
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = self.bus.state
        state.train_dataloader = trainer.train_dataloader
        state.eval_dataloader = trainer.val_dataloaders
        state.optimizers = list(trainer.optimizers)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.bus.publish(E.EPOCH_START)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        state = self.bus.state
        state.batch = batch
        state.batch_num_samples = batch_size_of(batch)
        self.bus.publish(E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH)

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        self.bus.state.loss = loss.detach()
        self.bus.publish(E.AFTER_LOSS, E.BEFORE_BACKWARD)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.bus.publish(E.AFTER_BACKWARD)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self.bus.publish(E.AFTER_TRAIN_BATCH)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        bus = self.bus
        bus.state.outputs = outputs
        bus.advance_batch()
        bus.publish(E.BATCH_END, E.BATCH_CHECKPOINT)
        if bus.state.stop_requested:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        bus = self.bus
        bus.advance_epoch()
        bus.publish(E.EPOCH_END, E.EPOCH_CHECKPOINT)
        if bus.state.stop_requested:
            trainer.should_stop = True

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not _skip_validation(trainer):
            self.bus.publish(E.EVAL_START)

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if _skip_validation(trainer):
            return
        self.bus.state.batch = batch
        self.bus.publish(E.EVAL_BATCH_START, E.EVAL_BEFORE_FORWARD)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if _skip_validation(trainer):
            return
        self.bus.state.outputs = outputs
        self.bus.publish(E.EVAL_AFTER_FORWARD, E.EVAL_BATCH_END)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if _skip_validation(trainer):
            return
        state = self.bus.state
        metrics = dict(state.current_metrics)
        metrics["eval"] = {str(k): v for k, v in trainer.callback_metrics.items()}
        state.current_metrics = metrics
        self.bus.publish(E.EVAL_END)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.bus.publish(E.FIT_END)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._direct:
            self._direct = False
            self.bus.close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._direct:  # plain trainer.fit(): Lightning skips teardown after an error
            self._direct = False
            self.bus.close()
