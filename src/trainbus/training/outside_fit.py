"""What a trainer does outside ``fit()``: an evaluation pass, a checkpoint (Composer's
``trainer.eval()`` and ``trainer.save_checkpoint()``).

:class:`OutsideFit` is a base of :class:`~trainbus.Trainer`; its methods use the trainer's
state, logger, engine and loop configuration. An evaluation is one cycle of the bus, as a
``fit()`` is (SPEC D6): ``INIT`` first if no cycle delivered it yet, then ``EVAL_START``
... ``EVAL_END``, then every callback's ``close`` and ``post_close``
(``docs/training-loop.md``, "Evaluation outside fit()").
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import anyio

from trainbus.checkpoint.format import capture
from trainbus.checkpoint.resume import epoch_rng
from trainbus.checkpoint.sharded import is_sharded
from trainbus.core.bridge import OWN_LOOP, LoopHandle, no_running_loop
from trainbus.core.events import Event
from trainbus.core.exceptions import EngineThreadError, FitInProgressError
from trainbus.runtime.interrupt import sigint_handled
from trainbus.training.checks import _check_loader
from trainbus.training.loop import TrainingLoop

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.core.logger import Logger
    from trainbus.core.state import State
    from trainbus.training.loop import LoopConfig

__all__ = ["OutsideFit"]


class OutsideFit:
    """The trainer's ``eval()``, ``eval_sync()`` and ``save_checkpoint()``."""

    state: State
    logger: Logger
    engine: Engine
    _config: LoopConfig
    _init_delivered: bool

    async def eval(self, dataloader: Iterable[Any] | None = None) -> dict[str, float]:
        """One evaluation pass, with its events, outside ``fit()``.

        Usable on its own, after ``fit()``, or on a trainer built with ``load_path=``
        (the held-out metrics of a loaded model). Each callback sees ``EVAL_START``,
        ``EVAL_BATCH_START``, ``EVAL_BEFORE_FORWARD``, ``EVAL_AFTER_FORWARD``,
        ``EVAL_BATCH_END`` (per batch) and ``EVAL_END`` once each (``INIT`` first when
        no ``fit()`` or ``eval()`` delivered it yet), then ``close`` and ``post_close``:
        one cycle, as a ``fit()`` is. The metrics are logged as during ``fit()``
        (``eval/loss`` and the model's ``eval_metrics``, at the current step) and kept in
        ``state.current_metrics["eval"]``. The model is left in training mode.

        Args:
            dataloader: The batches to evaluate (the same conventions as for training);
                default: the trainer's ``eval_dataloader``.

        Returns:
            The logged metrics as floats, e.g. ``{"eval/loss": 0.19}``.

        Raises:
            ValueError: No ``dataloader`` and the trainer has no ``eval_dataloader``.
            FitInProgressError: A ``fit()`` or ``eval()`` of this trainer is running.

        Example:
            >>> metrics = await trainer.eval(test_loader)      # trainer.eval_sync(...)
            >>> metrics["eval/loss"]
            0.19...
        """
        state = self.state
        if self.engine.running:
            raise FitInProgressError(
                "this trainer is already fitting or evaluating; await the running fit() "
                "(or eval()) first: an evaluation during fit() is eval_interval's"
            )
        loader = state.eval_dataloader if dataloader is None else dataloader
        if loader is None:
            raise ValueError(
                "eval() has nothing to evaluate: pass the batches, trainer.eval(dataloader="
                "test_loader), or build the trainer with eval_dataloader=..."
            )
        if dataloader is not None:
            _check_loader(dataloader, "dataloader")
        loop = TrainingLoop(state, self.logger, self._config)
        deliver_init = not self._init_delivered
        self._init_delivered = True

        def produce() -> None:
            loop.bind(self.engine.publisher())  # this cycle's
            if deliver_init:
                loop.publish(Event.INIT)
            loop.evaluate(loader)

        await self.engine.run_cycle(produce)
        means = state.current_metrics.get("eval", {})
        return {f"eval/{name}": float(value) for name, value in means.items()}

    def eval_sync(
        self,
        dataloader: Iterable[Any] | None = None,
        *,
        backend: Literal["asyncio", "trio"] = "asyncio",
    ) -> dict[str, float]:
        """Run :meth:`eval` from plain synchronous code (starts an event loop).

        Ctrl-C (on the main thread) stops the pass at the next event and closes every
        callback, then raises ``KeyboardInterrupt``.

        Raises:
            EngineThreadError: Called on a thread that runs an event loop; use
                ``await trainer.eval()`` there.
        """
        if not no_running_loop():
            raise EngineThreadError(
                "eval_sync() starts its own event loop, but this thread already runs one; "
                "use `await trainer.eval()` instead"
            )
        running: list[tuple[LoopHandle, anyio.CancelScope]] = []
        result: dict[str, float] = {}

        async def evaluate() -> None:
            OWN_LOOP.set(True)
            with anyio.CancelScope() as scope:
                running.append((LoopHandle(), scope))
                result.update(await self.eval(dataloader))

        def cancel() -> None:  # from the SIGINT handler: cancel on the loop
            for loop, scope in running:
                loop.call_soon(scope.cancel)

        with sigint_handled(self.engine, cancel) as presses:
            anyio.run(evaluate, backend=backend)
        if presses is not None and presses.count:
            raise KeyboardInterrupt
        return result

    def save_checkpoint(
        self, path: str | os.PathLike[str], *, weights_only: bool = False
    ) -> pathlib.Path:
        """Write a checkpoint of the trainer now, as ``CheckpointSaver`` writes one.

        The same file (model, optimizers, schedulers, timer, random generators and each
        callback's ``state_dict()``; or the weights and timer only), written atomically
        by the same writer; ``Trainer(load_path=path)`` resumes from it. Call it between
        ``fit()`` calls, or after one (Composer's ``trainer.save_checkpoint``); during a
        fit, a :class:`~trainbus.callbacks.CheckpointSaver` saves. Under ``torchrun``,
        rank zero writes; every rank returns the path.

        Args:
            path: The file to write; its folder is created. An existing file is replaced.
            weights_only: Save the model's weights and the timer only.

        Returns:
            The path written.

        Raises:
            FitInProgressError: A ``fit()`` or ``eval()`` of this trainer is running.
            ValueError: The model is sharded (FSDP): use a ``CheckpointSaver``.

        Example:
            >>> trainer.fit_sync()
            >>> trainer.save_checkpoint("runs/final.pt")
            PosixPath('runs/final.pt')
        """
        if self.engine.running:
            raise FitInProgressError(
                "save_checkpoint() is for between fits: a fit() of this trainer is running; "
                "to save during training, pass a CheckpointSaver in callbacks= (its "
                "request_save() saves at the next batch)"
            )
        if not isinstance(path, str | os.PathLike) or not str(path):
            raise TypeError(
                f"path={path!r} must be a file path (str or os.PathLike), e.g. "
                "trainer.save_checkpoint('runs/final.pt')"
            )
        state = self.state
        if is_sharded(state.model):
            raise ValueError(
                "save_checkpoint() writes one file, but the model is sharded (FSDP): save it "
                "with a CheckpointSaver in callbacks=, which writes a sharded checkpoint"
            )
        target = pathlib.Path(path)
        if state.rank == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            capture(state, weights_only=weights_only, epoch_rng=epoch_rng(state)).write(target)
        return target
