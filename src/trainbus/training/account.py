"""The time account of a fit: where its wall time went, from what the loop and the bus know.

One concept: a fit's wall time, from ``fit()``'s start to its return, split into parts that
add up to it, with no host-device synchronisation:

- on the training thread, a :class:`FitClock` reads ``time.perf_counter`` around each
  ``publish`` (14 reads a batch) and at the phase boundaries that no publish marks
  (evaluation entered, an epoch's first fetch, the loop ended): a batch's fetch ends at
  its first publish, the batch at its last; every second between two reads is charged to
  the phase in force (startup, data, compute, evaluation, replayed, close), less the time
  spent publishing;
- the time spent publishing is split with the bus's own counters
  (``Engine.statistics()``, read, not duplicated): waits at barriers and for full queues
  (each charged to the callback that ended it), plain ``@blocking`` handlers run on the
  training thread (a ``CheckpointSaver``'s: the checkpoint capture), and the rest, the
  bus's own cost;
- beside the split: the callbacks' work done off the training thread, and the part of it
  the training thread did not wait for (hidden).

On CUDA the clock also records a pair of CUDA events around each batch's compute (no
synchronisation: ``record`` only); :meth:`FitClock.device_seconds` reads the pairs whose
end has completed (``query``, never ``synchronize``) from whichever thread builds the
account (the account's metrics are built on a callback's lane, off the training thread).

The Trainer makes one clock per ``fit()``; :attr:`Trainer.time_account
<trainbus.Trainer.time_account>` builds a :class:`TimeAccount` from it (live during the
fit, final after it). ``docs/where-the-time-went.md`` reads one part by part.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final

from trainbus.core.callback import Callback

if TYPE_CHECKING:
    import torch

    from trainbus.core.logger import Logger
    from trainbus.core.state import State
    from trainbus.observe.statistics import BusStatistics, CallbackStatistics

__all__ = ["CallbackTime", "FitClock", "TimeAccount", "TimeMetrics", "format_account"]

_now = time.perf_counter

# The phases of the training thread (indices into FitClock.phase_s).
STARTUP: Final = 0  # fit() entered until the first batch is fetched
DATA: Final = 1  # fetching batches (and the loop's work between batches and epochs)
COMPUTE: Final = 2  # forward, loss, backward, optimizer step of a batch
EVALUATION: Final = 3  # evaluation passes
REPLAYED: Final = 4  # fetching and computing batches that a resumed run trains again
CLOSE: Final = 5  # the loop ended until fit() returned: callbacks catch up and close
_PHASES = 6
#: CUDA event pairs kept before the training thread reads the completed ones itself.
_PENDING_EVENTS = 256


@dataclass(frozen=True, slots=True)
class CallbackTime:
    """One callback's share of a fit.

    Attributes:
        name: The callback's class name.
        waited: Seconds the training thread waited for it: at barriers, for its full
            queue, for its ``@blocking`` handlers' turn (each wait charged to the callback
            that ended it).
        on_training_thread: Seconds its plain ``@blocking`` handlers ran on the training
            thread.
        off_thread: Seconds its handlers ran off the training thread (its lane thread or
            the event loop; an awaited ``async def`` handler counts its awaits).
        hidden: Of ``off_thread``, the work done while the training loop ran, less
            ``waited`` (never below 0): its work that overlapped training.
        calls: Handler calls completed.
        lag_batches: Batches it trailed the training thread by when the account was taken.
        peak_pending: The most of its calls ever queued at once.
    """

    name: str
    waited: float
    on_training_thread: float
    off_thread: float
    hidden: float
    calls: int
    lag_batches: int
    peak_pending: int

    @property
    def hidden_share(self) -> float:
        """``hidden / off_thread`` (1 when it did no work off the training thread)."""
        return self.hidden / self.off_thread if self.off_thread > 0 else 1.0


@dataclass(frozen=True, slots=True)
class TimeAccount:
    """Where a fit's wall time went (seconds; see :attr:`Trainer.time_account`).

    The parts ``startup`` to ``other`` add up to ``wall``; ``other`` is what the clock could
    not place (the loop's own bookkeeping, timer resolution), a few percent at most.

    Attributes:
        wall: Seconds from ``fit()``'s start to its return (to now, while it runs).
        startup: Before the first batch: threads started, ``INIT`` and ``FIT_START``
            handlers' own training-thread time excluded (they are in ``callbacks``).
        data: Waiting for the data loader (and moving batches to the device).
        compute: Forward, loss, backward and optimizer steps, as the host saw them (on
            CUDA the host only launches the work: see ``device_compute``).
        evaluation: Evaluation passes, less their events' callback time.
        checkpoint: ``CheckpointSaver`` captures on the training thread (the host copy;
            the write runs beside training and is in ``off_thread``).
        callbacks: The training thread waiting for callbacks (barriers, full queues) and
            running their ``@blocking`` handlers; per callback in ``per_callback``.
        bus: The bus's own cost on the training thread: snapshots, queueing, wake-ups.
        replayed: Fetching and computing the batches a resumed run trains a second time
            (those the killed run had trained after its checkpoint).
        close: After the last batch until ``fit()`` returned: callbacks finishing their
            queues, then ``close``.
        other: ``wall`` less every part above.
        off_thread: Callback work done off the training thread (beside ``wall``, not in it).
        hidden: Of ``off_thread``, what ran while training went on: each callback's work
            done before the loop ended, less the training thread's waits for it.
        batches: Batches trained in this fit.
        replayed_batches: Of those, batches trained a second time after a resume.
        device_compute: On CUDA, seconds the device spent on the batches' compute (CUDA
            events, read without synchronising: batches still in flight are not in it);
            ``None`` elsewhere.
        running: Whether the fit was still running when the account was taken.
        per_callback: One :class:`CallbackTime` per callback, in registration order.

    Example:
        >>> trainer.fit_sync()
        >>> acct = trainer.time_account
        >>> round(acct.compute / acct.wall, 2)
        0.71
        >>> print(acct.table())
    """

    wall: float
    startup: float
    data: float
    compute: float
    evaluation: float
    checkpoint: float
    callbacks: float
    bus: float
    replayed: float
    close: float
    other: float
    off_thread: float
    hidden: float
    batches: int
    replayed_batches: int
    device_compute: float | None
    running: bool
    per_callback: tuple[CallbackTime, ...]

    #: The parts that add up to ``wall``, in the order they are shown.
    PARTS: ClassVar[tuple[str, ...]] = (
        "startup", "data", "compute", "evaluation", "checkpoint", "callbacks", "bus",
        "replayed", "close", "other",
    )

    def parts(self) -> dict[str, float]:
        """The parts that add up to ``wall``, by name, in order."""
        return {name: float(getattr(self, name)) for name in self.PARTS}

    @property
    def hidden_share(self) -> float:
        """``hidden / off_thread`` (1 when no callback work ran off the training thread)."""
        return self.hidden / self.off_thread if self.off_thread > 0 else 1.0

    def metrics(self) -> dict[str, float]:
        """The account as ``time/...`` metrics (seconds), as the trainer logs them."""
        out = {f"time/{name}": value for name, value in self.parts().items()}
        out["time/wall"] = self.wall
        out["time/off_thread"] = self.off_thread
        out["time/hidden"] = self.hidden
        if self.device_compute is not None:
            out["time/device_compute"] = self.device_compute
        out["time/batches"] = float(self.batches)
        out["time/replayed_batches"] = float(self.replayed_batches)
        for cb in self.per_callback:
            head = f"time/callback/{cb.name}/"
            out[head + "training_thread"] = cb.waited + cb.on_training_thread
            out[head + "off_thread"] = cb.off_thread
            out[head + "hidden"] = cb.hidden
            out[head + "lag_batches"] = float(cb.lag_batches)
            out[head + "peak_pending"] = float(cb.peak_pending)
        return out

    def table(self) -> str:
        """A short table of the account, as printed at the end of a fit."""
        return format_account(self)


def format_account(acct: TimeAccount) -> str:
    """The end-of-fit table: every part with its share of the wall time (the same rows in
    every run, whatever was measured), then the callbacks that cost the training thread
    something, then the work hidden."""
    wall = acct.wall if acct.wall > 0 else 1.0
    lines = [f"where the time went ({acct.batches} batches, {acct.wall:.2f} s):"]
    for name, value in acct.parts().items():
        lines.append(f"  {name:<11}{value:9.3f} s {value / wall:6.1%}")
    charged = sorted(
        (cb for cb in acct.per_callback if cb.waited + cb.on_training_thread >= 0.0005),
        key=lambda cb: -(cb.waited + cb.on_training_thread),
    )
    for cb in charged[:5]:
        lines.append(
            f"    {cb.name:<20} {cb.waited + cb.on_training_thread:7.3f} s on the training thread"
        )
    if acct.replayed_batches:
        lines.append(f"  ({acct.replayed_batches} batches trained again after the resume)")
    if acct.device_compute is not None:
        lines.append(f"  device compute (CUDA events) {acct.device_compute:.3f} s")
    lines.append(
        f"  callback work off the training thread {acct.off_thread:.3f} s, "
        f"{acct.hidden_share:.0%} of it hidden behind training"
    )
    return "\n".join(lines)


class FitClock:
    """The training thread's clock for one fit (see the module docstring).

    Written by the training thread only (``fit()``'s start and end by the event loop's
    thread, before the training thread starts and after it ended); read from any thread
    (a live account is approximate).

    Invariant: every second from ``started`` to now is in exactly one of ``phase_s[i]``
    (closed phases), ``publish_s`` (inside ``publish``), or the open phase ``phase``: its
    time so far is ``now - publish_s - base`` (``base``: ``mark - publish_s`` when it
    opened, at ``mark``).

    Seconds are ``time.perf_counter()`` floats, as the bus's statistics: a float read and
    subtraction cost fewer instructions than an ``int`` of nanoseconds.
    """

    def __init__(
        self,
        statistics: Callable[[], BusStatistics],
        *,
        first_batch: int,
        replay_until: int | None,
        cuda: torch.device | None = None,
        savers: frozenset[str] = frozenset(),
        hide: frozenset[str] = frozenset({"TimeMetrics"}),
    ) -> None:
        self._statistics = statistics
        self.before = statistics()  # the bus's counters when the fit began
        self.at_loop_end: BusStatistics | None = None
        self.started = _now()
        self.ended: float | None = None
        self.phase = STARTUP
        self.mark = self.started
        self.phase_s = [0.0] * _PHASES
        self.publish_s = 0.0
        self.base = self.started
        self.last_end = self.started  # when the last publish returned
        #: Set when a batch arrived: the batch's first publish closes its fetch (at its own
        #: clock read) and opens ``next_phase``.
        self.fetch_pending = False
        self.next_phase = COMPUTE
        self.drain_s = 0.0  # the saver's wait for every handler, inside its @blocking call
        self.batch = first_batch  # the batch count the loop is at
        self.first_batch = first_batch
        self.replay_until = replay_until if replay_until is not None else -1
        self.replayed_batches = 0
        self.savers = savers  # the names of the callbacks that capture checkpoints
        self.hide = hide  # trainbus's own callbacks, left out of per_callback
        self._cuda = cuda  # the CUDA device whose compute is timed, or None
        self._events: deque[tuple[Any, Any]] = deque()  # (start, end) CUDA events
        self._events_lock = threading.Lock()  # device_seconds runs on any thread
        self._open_event: Any = None
        self._device_s = 0.0

    @classmethod
    def for_fit(cls, state: State, statistics: Callable[[], BusStatistics]) -> FitClock:
        """The clock of a fit that starts now, from ``state`` (its batch, its device, its
        callbacks: the checkpoint savers, the destinations that know what a resume
        replays) and the bus's ``statistics``."""
        from trainbus.callbacks.checkpoint_saver import CheckpointSaver

        callbacks = state.callbacks
        return cls(
            statistics,
            first_batch=int(state.timestamp.batch),
            replay_until=_replay_until(callbacks),
            cuda=state.device if state.device.type == "cuda" else None,
            savers=frozenset(
                type(cb).__name__ for cb in callbacks if isinstance(cb, CheckpointSaver)
            ),
        )

    # -- the training thread ----------------------------------------------------------------

    def _switch(self, phase: int, now: float | None = None) -> None:
        """Close the open phase at ``now`` (default: the clock) and open ``phase``."""
        if now is None:
            now = _now()
        net = now - self.publish_s
        self.phase_s[self.phase] += net - self.base
        self.base = net
        self.mark = now
        self.phase = phase

    def timed(self, publish: Callable[..., None]) -> Callable[..., None]:
        """``publish``, with the time spent in it counted (two clock reads a call)."""
        clock = self

        def timed_publish(*events: Any) -> None:
            t0 = _now()
            if clock.fetch_pending:  # the batch's first publish: its fetch ended here
                clock.fetch_pending = False
                net = t0 - clock.publish_s
                clock.phase_s[clock.phase] += net - clock.base
                clock.base = net
                clock.mark = t0
                clock.phase = clock.next_phase
            try:
                publish(*events)
            finally:
                t1 = _now()
                clock.publish_s += t1 - t0
                clock.last_end = t1

        return timed_publish

    def timed_drain(self, drain: Callable[[], None]) -> Callable[[], None]:
        """The saver's wait for every handler, timed (it happens inside its ``@blocking``
        handler, whose time would otherwise count it twice)."""

        def timed() -> None:
            t0 = _now()
            try:
                drain()
            finally:
                self.drain_s += _now() - t0

        return timed

    def fetching(self) -> None:
        """The loop starts fetching an epoch's batches."""
        if self.phase == STARTUP:
            self._switch(DATA)

    def fetched(self) -> None:
        """A batch arrived: its fetch (and its move to the device) was data (or replayed)
        time until the batch's first publish, whose clock read closes it; its compute
        begins there. (No clock read here: this runs once a batch.)"""
        self.batch = batch = self.batch + 1
        if batch <= self.replay_until:
            self.phase = self.next_phase = REPLAYED  # its fetch is replayed work too
            self.replayed_batches += 1
        else:
            self.next_phase = COMPUTE
        self.fetch_pending = True
        if self._cuda is not None:
            self._open_event = _cuda_event(self._cuda)

    def batch_done(self) -> None:
        """The batch's events are published (the last publish just returned): what follows
        is fetching the next batch. (Written out, without a clock read: once a batch.)"""
        if self._cuda is not None and self._open_event is not None:
            self._events.append((self._open_event, _cuda_event(self._cuda)))
            self._open_event = None
            if len(self._events) > _PENDING_EVENTS:  # bounded when nobody reads them
                self.device_seconds()
        now = self.last_end
        if now < self.mark:  # a publish skipped (a distributed run holding a failure)
            now = _now()
        net = now - self.publish_s
        self.phase_s[self.phase] += net - self.base
        self.base = net
        self.mark = now
        self.phase = DATA

    def evaluating(self) -> int:
        """Evaluation starts; returns the phase to go back to (:meth:`evaluated`)."""
        back = self.phase
        self._switch(EVALUATION)
        return back

    def evaluated(self, back: int) -> None:
        """Evaluation ended (its last publish just returned)."""
        self._switch(back, self.last_end)

    def loop_ended(self) -> None:
        """The training loop returned (or raised): the bus's counters as of now (the waits
        and ``@blocking`` time the publishing held); close begins."""
        self.at_loop_end = self._statistics()
        self._switch(CLOSE)

    # -- the event loop's thread ------------------------------------------------------------

    def end(self) -> None:
        """``fit()`` returns."""
        if self.ended is None:
            if self.at_loop_end is None:  # the loop never started (an error before it)
                self.at_loop_end = self._statistics()
            self._switch(CLOSE)
            self.ended = self.mark

    # -- any thread ---------------------------------------------------------------------------

    def device_seconds(self) -> float | None:
        """Seconds of the completed batches' device compute (CUDA); ``None`` on CPU. Reads
        only pairs whose end event has completed (``query``), never waits for the device."""
        if self._cuda is None:
            return None
        events = self._events
        with self._events_lock:
            while events:
                start, end = events[0]
                if not end.query():
                    break
                self._device_s += start.elapsed_time(end) / 1000.0  # ms
                events.popleft()
            return self._device_s

    def account(self) -> TimeAccount:
        """The account as of now (live) or of the fit's end."""
        now = self.ended if self.ended is not None else _now()
        parts = list(self.phase_s)
        if self.ended is None:  # the open phase, so far
            parts[self.phase] += now - self.publish_s - self.base
        final = self._statistics()
        held = self.at_loop_end if self.at_loop_end is not None else final
        before = {i: c for i, c in enumerate(self.before.callbacks)}
        per_callback = []
        inline_total = capture = off_total = hidden_total = 0.0
        for i, (c_held, c_final) in enumerate(zip(held.callbacks, final.callbacks, strict=False)):
            b = before.get(i)
            waited = c_held.barrier_wait_caused - (b.barrier_wait_caused if b else 0.0)
            inline = c_held.inline_time - (b.inline_time if b else 0.0)
            off_before = (b.total_time - b.inline_time) if b else 0.0
            off = c_final.total_time - c_final.inline_time - off_before
            # Hidden: the work done while the loop ran that the training thread did not wait
            # for (work after the loop ended, while fit() closes, is in ``close``).
            hidden = max(0.0, c_held.total_time - c_held.inline_time - off_before - waited)
            if c_final.name in self.savers:
                capture += inline
            else:
                inline_total += inline
            off_total += off
            hidden_total += hidden
            if c_final.name not in self.hide:
                per_callback.append(_callback_time(c_final, b, waited, inline, off, hidden))
        waits = (held.barrier_wait_time + held.backpressure_wait_time) - (
            self.before.barrier_wait_time + self.before.backpressure_wait_time
        )
        drain = self.drain_s
        checkpoint = max(0.0, capture - drain)
        callbacks = waits + inline_total
        published = self.publish_s
        bus = max(0.0, published - waits - inline_total - checkpoint)
        wall = now - self.started
        close = parts[CLOSE]
        placed = sum(parts) + checkpoint + callbacks + bus
        other = wall - placed
        if abs(other) < 1e-6:  # float rounding of a partition that adds up
            other = 0.0
        return TimeAccount(
            wall=wall,
            startup=parts[STARTUP],
            data=parts[DATA],
            compute=parts[COMPUTE],
            evaluation=parts[EVALUATION],
            checkpoint=checkpoint,
            callbacks=callbacks,
            bus=bus,
            replayed=parts[REPLAYED],
            close=close,
            other=other,
            off_thread=off_total,
            hidden=min(hidden_total, off_total),
            batches=self.batch - self.first_batch,
            replayed_batches=self.replayed_batches,
            device_compute=self.device_seconds(),
            running=self.ended is None,
            per_callback=tuple(per_callback),
        )


def _replay_until(callbacks: Sequence[object]) -> int | None:
    """The last batch a killed run trained after the checkpoint this run resumed from, as
    its destinations' files tell (``replayed_until()``: ``JSONLinesLogger``), or ``None``."""
    found = [
        until() for cb in callbacks if callable(until := getattr(cb, "replayed_until", None))
    ]
    known = [int(v) for v in found if v is not None]
    return max(known) if known else None


def _callback_time(
    c: CallbackStatistics, before: CallbackStatistics | None, waited: float, inline: float,
    off: float, hidden: float,
) -> CallbackTime:
    return CallbackTime(
        name=c.name,
        waited=float(waited),
        on_training_thread=float(inline),
        off_thread=float(off),
        hidden=min(hidden, float(off)),
        calls=c.handled - (before.handled if before else 0),
        lag_batches=c.lag_batches,
        peak_pending=c.peak_pending,
    )


def _cuda_event(device: torch.device) -> Any:
    """A timing event recorded on ``device``'s current stream (no synchronisation)."""
    import torch

    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record(torch.cuda.current_stream(device))
    return event


class TimeMetrics(Callback):
    """Logs the running fit's :class:`TimeAccount` as ``time/...`` metrics to every
    destination, at each epoch's end (``EPOCH_CHECKPOINT``: after the epoch's evaluation)
    and at the fit's end unless an epoch just ended there
    (as of ``FIT_END``: ``close`` is in the account :attr:`Trainer.time_account` gives
    after the fit, not in these). The values add up from the fit's start; at its start it
    logs ``time/fit_start`` (the batch it starts from: above 0 after a resume), which is
    how ``trainbus report`` finds where a run resumed.

    Its handlers are plain methods: they run on its lane, off the training thread (the
    account reads CUDA events there). The Trainer adds it with the progress output.
    """

    def __init__(self, account: Callable[[], TimeAccount | None]) -> None:
        self._account = account
        self._logged_at = -1

    def _log(self, state: State, logger: Logger) -> None:
        acct = self._account()
        if acct is not None:
            self._logged_at = int(state.timestamp.batch)
            logger.log_metrics(acct.metrics())

    def fit_start(self, state: State, logger: Logger) -> None:
        """Log where the fit starts."""
        self._logged_at = -1
        logger.log_metrics({"time/fit_start": float(state.timestamp.batch)})

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Log the account so far (the epoch's evaluation included)."""
        self._log(state, logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        """Log the account as of the last batch (unless its epoch's end just did)."""
        if int(state.timestamp.batch) != self._logged_at:
            self._log(state, logger)
