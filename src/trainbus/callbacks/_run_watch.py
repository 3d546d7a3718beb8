"""``RunWatch``: what an operator watches of one run, kept for a scrape or a health probe.

The watch handles no per-batch event: the engine's :class:`~trainbus.observe.clock.BatchClock`
counts each batch's end (one clock read and a histogram bucket as the producer publishes
``BATCH_END``: no handler, no snapshot), and the logger hands it each record as it is
logged (``Logger._tap``: the latest value of each scalar name kept in a dict, on the logging
thread; no lane, no wake-up). Everything else is read when someone asks
(:meth:`RunWatch.health`, the Prometheus collector of ``callbacks/prometheus.py``): the
run's counters off the live timer, each callback's time, queue and lag off
``engine.statistics()``, the checkpoints off each ``CheckpointSaver``'s statistics.

The health rule (``docs/watching-a-run.md``): ``starting`` until the fit's first batch
completes; then ``healthy`` while the time since the last batch stays within
``max(stall_floor, stall_factor x the recent step time)`` (the median of the last 32
steps); ``stalled`` past it. The clock pauses during evaluation and while the training
thread runs a checkpoint event's ``@blocking`` handler (a ``CheckpointSaver``'s capture,
or its wait for the previous write): ``paused``, and the deadline counts again from the
pause's end as seen by the last probe. ``ended`` after ``FIT_END``, ``failed`` after a fit
that ended without it. It is a report: nothing in the run reads it.
"""

from __future__ import annotations

import math
import statistics as _stats
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from trainbus.core.backpressure import Backpressure
from trainbus.core.callback import Callback, blocking
from trainbus.core.destination import LoggerDestination
from trainbus.observe.clock import STEP_BUCKETS, BatchClock

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine
    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State

__all__ = [
    "DEFAULT_MAX_SCALARS",
    "DEFAULT_STALL_FACTOR",
    "DEFAULT_STALL_FLOOR",
    "STEP_BUCKETS",
    "Health",
    "JobWatch",
    "RunWatch",
]

#: A run is stalled when no batch completed for this many times its recent step time ...
DEFAULT_STALL_FACTOR = 10.0
#: ... and for at least this many seconds (a probe's period should be shorter).
DEFAULT_STALL_FLOOR = 60.0
#: Logged scalar names kept (the first ones seen); later names are counted, not kept.
DEFAULT_MAX_SCALARS = 200
#: The handlers during which the training thread works on a checkpoint (their method name).
_perf = time.perf_counter
_CHECKPOINT_EVENTS = ("batch_checkpoint", "epoch_checkpoint", "fit_end")

Status = Literal["starting", "healthy", "paused", "stalled", "ended", "failed"]


@dataclass(frozen=True, slots=True)
class Health:
    """One reading of the health check.

    Attributes:
        status: ``starting`` (no batch completed yet in this fit), ``healthy``,
            ``paused`` (evaluation or a checkpoint on the training thread), ``stalled``
            (no batch for longer than :attr:`deadline`), ``ended`` (the fit ended),
            ``failed`` (the fit ended without ``FIT_END``: an error or a cancellation).
        ok: Whether a liveness probe should pass: every status but ``starting`` and
            ``stalled``.
        batches: Batches completed by the run (its timer's count).
        seconds_since_step: Seconds since the last batch completed (or since the fit
            started, or since the last pause ended, whichever is latest); ``None``
            before the first fit.
        deadline: Seconds without a batch after which the run counts as stalled.
        step_seconds: The recent step time (median of the last 32 steps), if known.
        reason: A sentence for a human.
    """

    status: Status
    ok: bool
    batches: int
    seconds_since_step: float | None
    deadline: float
    step_seconds: float | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (what ``/healthz`` answers)."""
        return {
            "status": self.status, "ok": self.ok, "batches": self.batches,
            "seconds_since_step": self.seconds_since_step, "deadline": self.deadline,
            "step_seconds": self.step_seconds, "reason": self.reason,
        }  # fmt: skip


def _positive(name: str, value: object, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"{name}={value!r} must be a number > 0, e.g. {example}")
    return float(value)


class RunWatch(Callback):
    """Keeps what a scrape or a health probe of one run reads (module doc).

    Pass it in ``callbacks=[...]`` (:class:`~trainbus.callbacks.PrometheusMetrics` is one;
    ``trainbus.serve`` gives every job a :class:`JobWatch`). Every reading is approximate
    (another thread reads what the training thread writes) and none changes what the run
    does.

    Args:
        stall_factor: No batch for this many times the recent step time is a stall ...
        stall_floor: ... if it is also longer than this many seconds.
        max_scalars: Logged scalar names kept for the latest-value gauges; the values of
            names beyond it are counted in :attr:`scalars_dropped`.

    Attributes:
        scalars: The latest value of each logged scalar (at most ``max_scalars`` names).
        scalars_dropped: Values of names beyond ``max_scalars`` not kept.

    Example:
        >>> watch = RunWatch(stall_floor=30)
        >>> trainer = Trainer(model, loader, "3ep", callbacks=[watch])
        >>> watch.health().status
        'starting'
    """

    #: Whether the scalars come from the logger's tap (a :class:`JobWatch` gets records).
    _tap_scalars = True

    def __init__(
        self,
        *,
        stall_factor: float = DEFAULT_STALL_FACTOR,
        stall_floor: float = DEFAULT_STALL_FLOOR,
        max_scalars: int = DEFAULT_MAX_SCALARS,
    ) -> None:
        self.stall_factor = _positive("stall_factor", stall_factor, "10 (times the step time)")
        self.stall_floor = _positive("stall_floor", stall_floor, "60 (seconds)")
        if isinstance(max_scalars, bool) or not isinstance(max_scalars, int) or max_scalars < 0:
            raise ValueError(f"max_scalars={max_scalars!r} must be an int >= 0, e.g. 200")
        self.max_scalars = max_scalars
        self.engine: Engine | None = None
        self._scalars: dict[str, Any] = {}  # as logged: converted when read
        self.scalars_dropped = 0
        self._last_wall: float | None = None  # the last fit's last batch, once it ended
        self._failed_before = 0  # fits that ended without FIT_END, before this one
        # Invariant: the training thread alone writes the fields below (its @blocking
        # handlers); readers take them as they are (a reading may be a batch old).
        self.clock = BatchClock()  # the engine's, once it joins one
        self._fit_start_batches = 0
        self._since: float | None = None  # when the clock (re)started: fit start, eval end
        self._phase: Literal["idle", "running", "eval", "ended", "failed"] = "idle"
        self._pause_seen: float | None = None  # a probe saw a checkpoint (its clock)
        self._lock = threading.Lock()  # readers' own state (_pause_seen, _checkpoints)
        self._checkpoints: tuple[int, float] = (0, 0.0)  # written, capture + write seconds
        self._last_checkpoint: tuple[float, float] | None = None
        #: ``None``, or a callable returning the fit's time account's ``{part: seconds}``.
        self.time_account: Callable[[], Mapping[str, float]] | None = None

    def _bind_engine(self, engine: Engine) -> None:
        """Called by the engine it joins (a private hook): its statistics, its live
        counters, its batch clock, and (but for a :class:`JobWatch`) its logger's records."""
        self.engine = engine
        self.clock = engine.batch_clock()
        if self._tap_scalars:
            engine.logger._tap(self.keep)

    # -- the training thread -----------------------------------------------------------------

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """A fit starts: the clock starts; ``starting`` until its first batch."""
        if self._phase in ("running", "eval"):  # the last fit ended without FIT_END
            self._failed_before += 1
        self._last_wall = self.last_step_time
        self.clock.restart()
        self._pause_seen = None
        self._since = time.perf_counter()
        self._phase = "running"

    @blocking
    def eval_start(self, state: State, logger: Logger) -> None:
        """Evaluation pauses the health check's clock."""
        if self._phase == "running":
            self._phase = "eval"

    @blocking
    def eval_end(self, state: State, logger: Logger) -> None:
        """The clock counts again from here."""
        if self._phase == "eval":
            self._phase = "running"
            self._since = time.perf_counter()

    @blocking
    def fit_end(self, state: State, logger: Logger) -> None:
        """The fit ended: ``ended`` until the next one."""
        self._phase = "ended"

    # -- the records (the logging thread) ----------------------------------------------------

    def keep(self, record: LogRecord) -> None:
        """Keep the latest value of each name of ``record`` (hyperparameters are not): as
        logged, converted to a number when read (:attr:`scalars`)."""
        if record.hyperparameters:
            return
        scalars, limit = self._scalars, self.max_scalars
        for name, value in record.metrics.items():
            if name in scalars or len(scalars) < limit:
                scalars[name] = value
            else:
                self.scalars_dropped += 1

    @property
    def scalars(self) -> dict[str, float]:
        """The latest value of each logged scalar (at most ``max_scalars`` names; values
        that are not single numbers are left out)."""
        out = {}
        for name, value in dict(self._scalars).items():
            try:
                out[name] = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue  # a tensor of many values, a string
        return out

    # -- readers (any thread) ----------------------------------------------------------------

    @property
    def last_step_time(self) -> float | None:
        """``time.time()`` when the last batch completed (``None``: none yet); derived from
        the batch clock's reading, so the training thread pays one clock read."""
        last = self.clock.last
        if last is None:
            return self._last_wall
        return time.time() - (_perf() - last)

    def _ended_without_fit_end(self) -> bool:
        engine = self.engine
        return self._phase in ("running", "eval") and engine is not None and not engine.running

    @property
    def fits_failed(self) -> int:
        """Fits that ended without ``FIT_END`` (an error, a cancellation)."""
        return self._failed_before + (1 if self._ended_without_fit_end() else 0)

    @property
    def preempted(self) -> bool:
        """Whether the run has a preemption notice (``state.preemption``)."""
        engine = self.engine
        return engine is not None and engine.state.preemption is not None

    @property
    def step_seconds(self) -> float | None:
        """The recent step time: the median of the last 32 steps (``None``: none yet)."""
        recent = list(self.clock.recent)
        return _stats.median(recent) if recent else None

    @property
    def batches(self) -> int:
        """Batches the run completed (its timer's count; a resumed run's include the
        checkpoint's), or 0 before the watch joined a trainer."""
        engine = self.engine
        return int(engine.state.timestamp.batch) if engine is not None else 0

    def note_checkpoints(self, written: int, seconds: float) -> tuple[float, float] | None:
        """The last checkpoint's ``(time.time(), duration)`` as a reader saw it complete.

        ``written`` and ``seconds`` (capture and write, all checkpoints together) are read
        off the savers' statistics; when ``written`` grew since the previous reading, the
        new ones' mean duration becomes the last one's.
        """
        with self._lock:
            before, spent = self._checkpoints
            if written > before:
                self._checkpoints = (written, seconds)
                self._last_checkpoint = (time.time(), (seconds - spent) / (written - before))
            return self._last_checkpoint

    def deadline(self) -> float:
        """Seconds without a batch after which the run counts as stalled."""
        step = self.step_seconds
        return max(self.stall_floor, self.stall_factor * step) if step else self.stall_floor

    def _in_checkpoint(self) -> bool:
        engine = self.engine
        handler = engine.training_thread_handler() if engine is not None else None
        return handler is not None and handler.rsplit(".", 1)[-1] in _CHECKPOINT_EVENTS

    def health(self) -> Health:
        """The run's health now (module doc); any thread, never waits for the run."""
        now = time.perf_counter()
        phase, last, since = self._phase, self.clock.last, self._since
        batches, deadline, step = self.batches, self.deadline(), self.step_seconds

        def reading(status: Status, ok: bool, elapsed: float | None, reason: str) -> Health:
            return Health(status, ok, batches, elapsed, deadline, step, reason)

        if phase == "idle" or since is None:
            return reading("starting", False, None, "no fit has started")
        if self._ended_without_fit_end():
            phase = "failed"
        marks = [m for m in (last, since) if m is not None]
        with self._lock:
            if phase in ("running", "eval") and (phase == "eval" or self._in_checkpoint()):
                self._pause_seen = now
                what = "evaluation" if phase == "eval" else "a checkpoint"
                return reading("paused", True, now - max(marks), f"{what} runs")
            if self._pause_seen is not None:
                marks.append(self._pause_seen)
        elapsed = now - max(marks)
        if phase == "ended":
            return reading("ended", True, elapsed, "the fit ended")
        if phase == "failed":
            return reading("failed", True, elapsed, "the fit ended without FIT_END")
        if last is None:
            return reading("starting", False, elapsed, "the fit's first batch has not ended")
        if elapsed > deadline:
            return reading(
                "stalled", False, elapsed,
                f"no batch completed for {elapsed:.1f} s (deadline {deadline:.1f} s)",
            )  # fmt: skip
        return reading("healthy", True, elapsed, "batches complete")


class JobWatch(RunWatch, LoggerDestination):
    """A :class:`RunWatch` that is a destination, for ``loggers=[...]`` (``trainbus.serve``
    gives one to every job in ``ctx.loggers``): the scalars arrive as records on the event
    loop, beside the job's other destinations, instead of through the logger's tap."""

    _tap_scalars = False
    #: Only the latest values matter: a slow reader never holds the training thread.
    backpressure = Backpressure.latest(64)

    async def log_record(self, record: LogRecord) -> None:
        """Keep the record's values (:meth:`RunWatch.keep`)."""
        self.keep(record)
