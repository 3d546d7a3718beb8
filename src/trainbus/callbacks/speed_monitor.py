"""``SpeedMonitor``: training throughput over a rolling window of batches.

Handlers run late on trainbus (on their own lane, after other callbacks), so a clock
read inside an ordinary handler measures when the handler ran, not when the batch
ended. SpeedMonitor's handlers are therefore plain ``@blocking`` methods: they run
inline on the training thread, in lockstep with the event (a few microseconds, most of
it the ``log_metrics`` call), so ``time.perf_counter()`` is read when the batch really
ended. The counts come from the event's timestamp.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from trainbus.core.callback import Callback, blocking

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["SpeedMonitor"]


class SpeedMonitor(Callback):
    """Logs throughput over the last ``window_size`` batches, and the wall-clock time.

    At every ``BATCH_END`` it logs:

    - ``throughput/samples_per_sec``: samples per second over the window;
    - ``throughput/batches_per_sec``: batches per second over the window;
    - ``wall_clock/train``: seconds since ``FIT_START`` of this ``fit()`` call.

    The window holds the end times of the last ``window_size`` batches (and, until it
    fills, the start of the fit), so the first batch already has a value. Evaluation
    passes are left out of the throughput: the window's clock stops from ``EVAL_START``
    to ``EVAL_END``. Every handler is ``@blocking`` and plain: it reads the clock on the
    training thread at the moment of its event: about 4 us per batch, most of it the
    ``log_metrics`` call.

    Args:
        window_size: Number of batches the throughput is averaged over (>= 1).

    Example:
        >>> from trainbus.callbacks import SpeedMonitor
        >>> from trainbus.loggers import InMemoryLogger
        >>> logs = InMemoryLogger()
        >>> trainer = Trainer(model, loader, "2ep", callbacks=[SpeedMonitor(window_size=50)],
        ...                   loggers=[logs])
        >>> trainer.fit_sync()
        >>> logs.most_recent_values["throughput/samples_per_sec"]
        5123.4
    """

    _clock = staticmethod(time.perf_counter)

    def __init__(self, window_size: int = 100) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ValueError(
                f"SpeedMonitor(window_size={window_size!r}) must be an int >= 1 (batches), e.g. 100"
            )
        self.window_size = window_size
        # (training clock, samples, batches) at the end of each batch in the window.
        self._window: deque[tuple[float, int, int]] = deque(maxlen=window_size + 1)
        self._fit_start = 0.0
        self._paused = 0.0  # seconds of evaluation, left out of the training clock
        self._eval_start: float | None = None

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Start the wall clock and the window."""
        now = self._clock()
        ts = state.timestamp
        self._fit_start = now
        self._paused = 0.0
        self._eval_start = None
        self._window.clear()
        self._window.append((now, int(ts.sample), int(ts.batch)))

    @blocking
    def eval_start(self, state: State, logger: Logger) -> None:
        """Stop the training clock while evaluating."""
        self._eval_start = self._clock()

    @blocking
    def eval_end(self, state: State, logger: Logger) -> None:
        """Restart the training clock."""
        if self._eval_start is not None:
            self._paused += self._clock() - self._eval_start
            self._eval_start = None

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        """Add the batch to the window and log throughput and wall-clock time."""
        now = self._clock()
        ts = state.timestamp
        window = self._window
        window.append((now - self._paused, int(ts.sample), int(ts.batch)))
        metrics: dict[str, Any] = {"wall_clock/train": now - self._fit_start}
        t0, samples0, batches0 = window[0]
        t1, samples1, batches1 = window[-1]
        elapsed = t1 - t0
        if elapsed > 0 and len(window) > 1:
            metrics["throughput/samples_per_sec"] = (samples1 - samples0) / elapsed
            metrics["throughput/batches_per_sec"] = (batches1 - batches0) / elapsed
        logger.log_metrics(metrics)
