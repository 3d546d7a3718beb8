"""trainbus callbacks and loggers under the Hugging Face ``Trainer`` (``trainbus[hf]``).

:class:`TrainbusCallback` is a ``transformers.TrainerCallback`` that publishes Composer's
events from the Trainer's hooks on a :class:`~trainbus.Bus`, with the state filled from the
Trainer's arguments, state, model and optimizer; what the Trainer logs (``on_log``'s
``logs``: loss, learning rate, grad norm, eval metrics, ...) reaches the trainbus loggers
as records. :meth:`TrainbusCallback.train` runs ``trainer.train()`` on a worker thread so
that the bus's handlers run on the awaiting event loop. The mapping, hook by hook, is a
table in ``docs/integrations.md``.

Example:
    >>> bridge = TrainbusCallback(callbacks=[Upload()], loggers=[InMemoryLogger()])
    >>> trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
    ...                                callbacks=[bridge])
    >>> await bridge.train(trainer)     # in async code
    >>> bridge.train_sync(trainer)      # in a script
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack

import anyio
import transformers

from trainbus.core.callback import Callback
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.time import Time
from trainbus.integrations._hosting import BusKeywords, start_hosted
from trainbus.integrations.loop import Bus, _refuse_in_loop

__all__ = ["TrainbusCallback"]

E = Event


def _numbers(logs: Mapping[str, Any]) -> dict[str, float | int]:
    """The real-number values of ``logs`` (the Trainer's logs may hold strings too)."""
    return {
        str(k): v if isinstance(v, int) else float(v)
        for k, v in logs.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    }


class TrainbusCallback(transformers.TrainerCallback):
    """Runs trainbus callbacks and loggers on the bus during a Hugging Face ``train()``.

    Pass it in ``Trainer(callbacks=[...])`` and start training with :meth:`train` (async)
    or :meth:`train_sync`: ``trainer.train()`` runs on a worker thread, the handlers on the
    event loop (``async def``), on their callbacks' threads (plain) or in lockstep
    (``@blocking``), with barriers and ``max_lag`` as under :class:`~trainbus.Trainer`.
    Called as plain ``trainer.train()`` it still works, but each event's handlers then
    run before the Trainer continues (nothing overlaps), as in Composer.

    Args:
        callbacks: trainbus :class:`~trainbus.Callback` instances.
        loggers: trainbus :class:`~trainbus.LoggerDestination` instances; they also
            receive every ``on_log`` as a record (its real-number values).
        run_name: ``state.run_name``; default: the Trainer's ``args.run_name``.
        **bus_options: ``barriers``, ``max_lag``, ``queue_size``, ``warn_slow_callbacks``,
            ``close_timeout``, ``wait_warning_seconds``: as for :class:`~trainbus.Bus`, handed to it
            unchanged.

    Attributes:
        bus: The :class:`~trainbus.Bus` (``bus.state``, ``bus.statistics()``).
    """

    def __init__(
        self,
        callbacks: Sequence[Callback] | Callback = (),
        loggers: Sequence[LoggerDestination] | LoggerDestination = (),
        *,
        run_name: str | None = None,
        **bus_options: Unpack[BusKeywords],
    ) -> None:
        self.bus = Bus(
            callbacks=callbacks,
            loggers=loggers,
            run_name=run_name or "hf",
            **bus_options,
        )
        self._run_name = run_name
        self._direct = False
        self._in_eval = False
        self._training = False  # between on_train_begin and on_train_end

    # -- starting training ------------------------------------------------------------------

    async def train(self, trainer: transformers.Trainer, *args: Any, **kwargs: Any) -> Any:
        """``trainer.train(*args, **kwargs)`` on a worker thread, the bus on this loop.

        Returns the Trainer's ``TrainOutput`` once training ended and every trainbus
        callback's ``close`` and ``post_close`` have run. Raises what training or a
        handler raised; cancelling the awaiting task stops training at its next hook.

        Raises:
            ValueError: This callback is not among ``trainer``'s callbacks.
        """
        if not any(cb is self for cb in trainer.callback_handler.callbacks):
            raise ValueError(
                "this TrainbusCallback is not among the trainer's callbacks; build it with "
                "Trainer(..., callbacks=[bridge]) or call trainer.add_callback(bridge)"
            )
        try:
            return await self.bus.host(lambda: trainer.train(*args, **kwargs))
        finally:
            self._training = self._in_eval = False

    def train_sync(
        self,
        trainer: transformers.Trainer,
        *args: Any,
        backend: Literal["asyncio", "trio"] = "asyncio",
        **kwargs: Any,
    ) -> Any:
        """:meth:`train` from plain synchronous code (starts an event loop for the handlers)."""
        _refuse_in_loop("bridge.train_sync()", "await bridge.train(trainer)")

        async def main() -> Any:
            return await self.train(trainer, *args, **kwargs)

        return anyio.run(main, backend=backend)

    # -- the Trainer's hooks ----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        bus = self.bus
        self._training, self._in_eval = True, False
        st = bus.state
        model = kwargs.get("model")
        if model is not None:
            st.model = model
            st.device = next(iter(model.parameters())).device
        optimizer = kwargs.get("optimizer")
        st.optimizers = [optimizer] if optimizer is not None else []
        scheduler = kwargs.get("lr_scheduler")
        st.schedulers = [scheduler] if scheduler is not None else []
        st.train_dataloader = kwargs.get("train_dataloader")
        st.eval_dataloader = kwargs.get("eval_dataloader")
        st.grad_accum = int(args.gradient_accumulation_steps)
        st.precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        st.rank, st.world_size = int(args.process_index), int(args.world_size)
        st.local_rank = max(int(args.local_process_index), 0)
        if self._run_name is None and getattr(args, "run_name", None):
            st.run_name = str(args.run_name)
        if state.max_steps and state.max_steps > 0:
            st.max_duration = Time(int(state.max_steps), "ba")
        self._direct = start_hosted(
            bus, call="trainer.train()", alternative="await bridge.train(trainer)"
        )

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.bus.publish(E.EPOCH_START)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        st = self.bus.state
        st.batch = None  # the Trainer does not hand its inputs to callbacks
        st.batch_num_samples = int(args.train_batch_size) * int(args.gradient_accumulation_steps)
        self.bus.publish(E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.bus.publish(E.AFTER_BACKWARD)  # a microbatch's backward, not the last one

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The last microbatch's backward is done and the gradients clipped; not applied.
        self.bus.publish(E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        bus = self.bus
        bus.advance_batch()
        bus.publish(E.BATCH_END, E.BATCH_CHECKPOINT)
        if bus.state.stop_requested:
            control.should_training_stop = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        values = _numbers(logs or {})
        if values and self._training:
            self.bus.logger.log_metrics(values)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._training:  # trainer.evaluate()/predict() outside train()
            return
        if not self._in_eval:
            self._in_eval = True
            self.bus.publish(E.EVAL_START)
        self.bus.publish(E.EVAL_AFTER_FORWARD, E.EVAL_BATCH_END)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self._training:
            return
        if not self._in_eval:
            self.bus.publish(E.EVAL_START)
        self._in_eval = False
        st = self.bus.state
        current = dict(st.current_metrics)
        current["eval"] = dict(metrics or {})
        st.current_metrics = current
        self.bus.publish(E.EVAL_END)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        bus = self.bus
        bus.advance_epoch()
        bus.publish(E.EPOCH_END, E.EPOCH_CHECKPOINT)
        if bus.state.stop_requested:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        self.bus.publish(E.FIT_END)
        if self._direct:
            self._direct = False
            self.bus.close()
