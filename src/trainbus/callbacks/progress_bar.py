"""``ProgressBar``: a tqdm bar per epoch on a terminal, plain lines anywhere else.

tqdm is optional (``pip install 'trainbus[progress]'``) and imported only when a bar is
drawn. Every handler is a plain method, so the bar is written on the progress bar's lane
thread, never on the training thread or the event loop. Batches are counted at
``BATCH_CHECKPOINT``, which is not a barrier, by a ``@trailing(2)`` handler (it reads only
its event's snapshot): training does not wait for the bar, neither at the end of a batch nor
at the live fence before the next one's gradients are zeroed. While
bars are drawn, ``sys.stdout`` and ``sys.stderr`` write whole lines around them (tqdm's
``tqdm.write``), so ``print()`` from a handler does not break a bar.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Literal, TextIO

from trainbus.callbacks._interval import Interval
from trainbus.core.destination import LoggerDestination
from trainbus.core.events import Event
from trainbus.core.scalars import DeferredScalar
from trainbus.core.time import Time, TimeUnit
from trainbus.core.trailing import trailing

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["ProgressBar"]

_MODES = ("auto", "tqdm", "plain")
_INSTALL = "pip install 'trainbus[progress]'"


def _tqdm_class() -> type[Any]:
    """tqdm's bar class without its monitor thread (nothing may outlive ``fit()``)."""
    try:
        from tqdm import tqdm
    except ImportError as exc:
        raise ImportError(
            f"ProgressBar(bar='tqdm') draws its bar with tqdm, which is not installed; "
            f"run `{_INSTALL}` (or use ProgressBar(bar='plain'))"
        ) from exc

    class _Bar(tqdm):  # type: ignore[misc]
        monitor_interval = 0

    return _Bar


class _AroundBar:
    """``sys.stdout`` / ``sys.stderr`` while a bar is drawn: whole lines go out between
    clearing the bar and drawing it again, under tqdm's lock (``tqdm.write`` semantics),
    so ``print()`` from any handler, on any thread, never lands inside the bar."""

    def __init__(self, wrapped: TextIO, owner: ProgressBar) -> None:
        self._wrapped = wrapped
        self._owner = owner
        self._buf: list[str] = []
        self._buf_lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._buf_lock:
            head, newline, tail = text.rpartition("\n")
            if not newline:
                self._buf.append(text)
                return len(text)
            lines = "".join([*self._buf, head, newline])
            self._buf = [tail] if tail else []
        self._owner._write_around_bar(self._wrapped, lines)
        return len(text)

    def flush(self) -> None:
        self._wrapped.flush()  # a partial line waits for its newline (or the bar's close)

    def release(self) -> None:
        """Write what is left of a partial line."""
        with self._buf_lock:
            rest, self._buf = "".join(self._buf), []
        if rest:
            self._owner._write_around_bar(self._wrapped, rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def _tqdm_available() -> bool:
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class ProgressBar(LoggerDestination):
    """Shows training progress with the latest loss.

    A :class:`~trainbus.Trainer` adds one by default (``progress=True``, unless
    ``TRAINBUS_PROGRESS=0``); pass your own to choose its mode, stream or interval: it is
    then the only bar, and the end-of-fit time account is written to its stream.

    With ``bar="auto"`` it draws a tqdm bar when ``stream`` is a terminal (and tqdm is
    installed) and otherwise writes plain lines, which read well in log files and CI:
    one every ``interval`` and one at the end of each epoch and evaluation.
    ``bar="tqdm"`` always draws a bar (``ImportError`` naming the extra to install if
    tqdm is missing); ``bar="plain"`` always writes lines.

    There is one bar per epoch, or one bar for the whole run when ``max_duration`` is
    in batches. The bar advances at ``BATCH_CHECKPOINT``, right after ``BATCH_END`` but
    not a barrier, so training never waits for the terminal at the end of a batch. The
    postfix shows ``loss`` (from the ``loss/train`` values the trainer logs, which a
    progress bar receives as a :class:`~trainbus.LoggerDestination`) and the latest
    evaluation metrics. Passed among ``callbacks`` of a trainer with no
    loggers, it reads ``state.loss`` instead when its value is already on the host.

    While it draws bars (from ``fit_start`` to ``close``), ``sys.stdout`` and
    ``sys.stderr`` print whole lines above the bar, as ``tqdm.write`` does, so
    ``print()`` in any handler is safe. A ``logging`` handler made before ``fit()`` keeps
    its own stream: wrap ``fit()`` in ``tqdm.contrib.logging.logging_redirect_tqdm()``.

    Args:
        bar: ``"auto"``, ``"tqdm"`` or ``"plain"``.
        stream: Where to write; default ``sys.stderr`` at ``fit()`` time.
        interval: How often plain mode writes a line: ``"100ba"``, a
            :class:`~trainbus.Time`, or an int number of epochs.

    Example:
        >>> from trainbus.callbacks import ProgressBar
        >>> Trainer(model, loader, "3ep", loggers=[ProgressBar()]).fit_sync()
        Epoch 1/3: 100%|██████████| 50/50 [00:01<00:00, 41.2ba/s, loss=0.4127]
    """

    def __init__(
        self,
        bar: Literal["auto", "tqdm", "plain"] = "auto",
        *,
        stream: TextIO | None = None,
        interval: Time[Any] | str | int = "100ba",
    ) -> None:
        if bar not in _MODES:
            raise ValueError(f"ProgressBar(bar={bar!r}) must be one of {', '.join(_MODES)}")
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise TypeError(
                f"ProgressBar(stream={stream!r}) must be a text stream such as sys.stderr"
            )
        self.bar = bar
        self.stream = stream
        self.interval = Interval(interval, name="ProgressBar(interval=...)")
        self._bar_cls: type[Any] | None = _tqdm_class() if bar == "tqdm" else None
        self._out: TextIO = sys.stderr
        self._use_tqdm = False
        self._pbar: Any = None
        self._loss: float | None = None
        self._loss_logged = False
        self._eval: dict[str, float] = {}
        self._redirected: list[tuple[str, _AroundBar]] = []

    # -- what it shows --------------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Keep the latest training loss and evaluation metrics for the postfix."""
        for name, value in metrics.items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            if name == "loss/train":
                self._loss = float(value)
                self._loss_logged = True
            elif name.startswith("eval/"):
                self._eval[name] = float(value)

    def _postfix(self) -> dict[str, str]:
        shown = {} if self._loss is None else {"loss": _fmt(self._loss)}
        shown.update({name: _fmt(value) for name, value in self._eval.items()})
        return shown

    def _line(self, head: str) -> None:
        parts = [head, *(f"{name} {value}" for name, value in self._postfix().items())]
        self._out.write("  ".join(parts) + "\n")
        self._out.flush()

    # -- bars -----------------------------------------------------------------------------

    def _write_around_bar(self, stream: TextIO, text: str) -> None:
        bar_cls = self._bar_cls
        if bar_cls is None:
            stream.write(text)
            stream.flush()
            return
        with bar_cls.get_lock():
            pbar = self._pbar
            if pbar is not None:
                pbar.clear(nolock=True)
            stream.write(text)
            stream.flush()
            if pbar is not None:
                pbar.refresh(nolock=True)

    def _redirect(self) -> None:
        """Route ``sys.stdout`` and ``sys.stderr`` around the bars until ``close``."""
        self._restore()
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is None or isinstance(stream, _AroundBar):
                continue
            around = _AroundBar(stream, self)
            setattr(sys, name, around)
            self._redirected.append((name, around))

    def _restore(self) -> None:
        for name, around in self._redirected:
            around.release()
            if getattr(sys, name) is around:  # unless someone replaced it since
                setattr(sys, name, around._wrapped)
        self._redirected = []

    def _close_bar(self) -> None:
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None

    def _open_bar(self, desc: str, total: int | None, initial: int) -> None:
        self._close_bar()
        assert self._bar_cls is not None
        self._pbar = self._bar_cls(
            total=total,
            initial=initial,
            desc=desc,
            unit="ba",
            file=self._out,
            dynamic_ncols=True,
            leave=True,
        )
        if self._postfix():
            self._pbar.set_postfix(self._postfix(), refresh=True)

    @staticmethod
    def _epoch_label(state: State, epoch: int) -> str:
        end = state.max_duration
        return f"Epoch {epoch}/{end.value}" if end.unit is TimeUnit.EPOCH else f"Epoch {epoch}"

    @staticmethod
    def _epoch_batches(state: State) -> int | None:
        try:
            return len(state.train_dataloader)
        except TypeError:
            return None

    # -- handlers (plain: they run on the progress bar's own lane) ------------------------

    def fit_start(self, state: State, logger: Logger) -> None:
        """Choose bar or lines; open the whole-run bar when the duration is in batches."""
        self._out = self.stream if self.stream is not None else sys.stderr
        self._loss_logged = False
        use = self.bar == "tqdm" or (
            self.bar == "auto" and _isatty(self._out) and _tqdm_available()
        )
        if use and self._bar_cls is None:
            self._bar_cls = _tqdm_class()
        self._use_tqdm = use
        if use:
            self._redirect()
        end = state.max_duration
        if use and end.unit is TimeUnit.BATCH:
            self._open_bar("Train", int(end.value), int(state.timestamp.batch))

    def epoch_start(self, state: State, logger: Logger) -> None:
        """Open the epoch's bar (per-epoch mode)."""
        if self._use_tqdm and state.max_duration.unit is not TimeUnit.BATCH:
            ts = state.timestamp
            label = self._epoch_label(state, int(ts.epoch) + 1)
            self._open_bar(label, self._epoch_batches(state), int(ts.batch_in_epoch))

    @trailing(2)  # reads only its event's snapshot: the next batch never waits for it
    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Advance the bar, or write a line when the batch is due."""
        if not self._loss_logged and state.loss is not None:
            deferred = DeferredScalar.of(state.loss)
            if deferred.ready():  # never wait for the device just to draw a bar
                self._loss = deferred.get()
        if self._use_tqdm:
            if self._pbar is not None:
                self._pbar.set_postfix(self._postfix(), refresh=False)
                self._pbar.update(1)
        elif self.interval.is_due(Event.BATCH_END, state):  # same counters as BATCH_END
            self._line(self._batch_head(state))

    def _batch_head(self, state: State) -> str:
        ts = state.timestamp
        end = state.max_duration
        if end.unit is TimeUnit.BATCH:
            return f"batch {int(ts.batch)}/{end.value}"
        per_epoch = self._epoch_batches(state)
        of = f"/{per_epoch}" if per_epoch is not None else ""
        label = self._epoch_label(state, int(ts.epoch) + 1).lower()
        return f"{label}  batch {int(ts.batch_in_epoch)}{of}"

    def epoch_end(self, state: State, logger: Logger) -> None:
        """Write the epoch's line (plain mode)."""
        if not self._use_tqdm:
            ts = state.timestamp
            label = self._epoch_label(state, int(ts.epoch)).lower()
            self._line(f"{label} done  batch {int(ts.batch)}")

    def eval_end(self, state: State, logger: Logger) -> None:
        """Show the evaluation metrics."""
        if self._use_tqdm:
            if self._pbar is not None:
                self._pbar.set_postfix(self._postfix(), refresh=True)
        else:
            self._line(f"eval at batch {int(state.timestamp.batch)}")

    def fit_end(self, state: State, logger: Logger) -> None:
        """Close the last bar."""
        self._close_bar()

    def close(self, state: State, logger: Logger) -> None:
        """Close the bar and give ``sys.stdout``/``sys.stderr`` back, also after a failure."""
        self._close_bar()
        self._restore()
        self._out.flush()
