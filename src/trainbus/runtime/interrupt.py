"""Ctrl-C for ``trainer.fit_sync()``: stop cleanly once, abandon on the second press.

``fit_sync`` runs the event loop on the main thread, so Python delivers SIGINT there. The
default behaviour (a ``KeyboardInterrupt`` raised wherever the loop happens to be, or the
loop's own handler) can land inside the close of the callbacks and leave files unflushed.
While ``fit_sync`` runs, this handler takes over instead:

1. The first Ctrl-C stops training at the next event, says on stderr what it waits for,
   and lets every callback close as after any cancellation (D11); then ``fit_sync`` raises
   ``KeyboardInterrupt``.
2. The second gives everything still running or closing at most 2 s more
   (``ABANDON_TIMEOUT``), abandons what has not finished by then (a stuck handler), and
   closes the rest under the same short deadline, then ``KeyboardInterrupt``. A close
   that is writing its file when the second Ctrl-C comes finishes it.
3. A third raises ``KeyboardInterrupt`` at once, as Python would.

The handler only sets flags and schedules calls on the loop (``call_soon``), which is safe
from a signal handler; it never raises before the third press.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.bus.engine import Engine

__all__ = ["sigint_handled"]


class _Presses:
    def __init__(self, engine: Engine, cancel: Callable[[], None]) -> None:
        self.engine = engine
        self.cancel = cancel
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            waiting = self.engine._describe_waiting()
            what = f" (waiting for {waiting})" if waiting else ""
            print(
                "trainbus: interrupted; stopping at the next event and closing the "
                f"callbacks{what}. Press Ctrl-C again to abandon them.",
                file=sys.stderr,
                flush=True,
            )
            self.engine._interrupt(self.cancel)
        elif self.count == 2:
            print(
                "trainbus: second Ctrl-C; giving what still runs 2 s, then abandoning it, "
                "and closing the rest under the same deadline.",
                file=sys.stderr,
                flush=True,
            )
            self.engine._abandon()
        else:
            raise KeyboardInterrupt


@contextmanager
def sigint_handled(engine: Engine, cancel: Callable[[], None]) -> Iterator[_Presses | None]:
    """Handle SIGINT as the module docstring says while the block runs (main thread only).

    ``cancel`` cancels the running ``fit()`` (it is called on the loop). Yields the press
    counter, or ``None`` where SIGINT cannot be handled here (not the main thread, or a
    handler other than Python's default is installed: then the caller's one stays).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield None
        return
    presses = _Presses(engine, cancel)
    signal.signal(signal.SIGINT, presses)
    try:
        yield presses
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
