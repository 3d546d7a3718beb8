"""What ``trainer.fit()`` returns: an awaitable that says so at once when it is dropped.

Composer v0.6's ``trainer.fit()`` trains when called; trainbus's must be awaited. Called the
Composer way, as a statement, a plain coroutine would train nothing and Python would only
warn "coroutine was never awaited" whenever the garbage collector got to it. A
:class:`FitCall` creates the training coroutine only when it is first awaited (or sent
into, as a task does), and when it is dropped without that it issues a
:class:`~trainbus.FitNotAwaitedWarning` pointing at the line that called ``fit()``. In
CPython the value of an expression statement is dropped right after the statement, so
the warning comes at once, from that line.

It is a :class:`collections.abc.Coroutine`, so ``asyncio.create_task(trainer.fit())``,
``asyncio.run(trainer.fit())``, ``anyio.run(trainer.fit)`` and task groups' ``start_soon``
take it as before.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from trainbus.core.exceptions import FitNotAwaitedWarning

__all__ = ["FitCall"]

_MESSAGE = (
    "trainer.fit() was never awaited, so nothing was trained: use `await trainer.fit()` "
    "in async code or `trainer.fit_sync()` in a script"
)


class FitCall(Coroutine[Any, Any, None]):
    """One ``trainer.fit(...)`` call, trained when it is awaited.

    Attributes:
        cr_code, cr_frame, cr_running, cr_await: Those of the training coroutine once it
            started (``None``/``False`` before).
    """

    __slots__ = ("_closed", "_coro", "_make", "_where")

    def __init__(self, make: Callable[[], Coroutine[Any, Any, None]], depth: int = 2) -> None:
        self._make = make
        self._coro: Coroutine[Any, Any, None] | None = None
        self._closed = False
        frame = sys._getframe(depth)  # the caller of trainer.fit(): where to point
        self._where = (frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__"))

    def _started(self) -> Coroutine[Any, Any, None]:
        coro = self._coro
        if coro is None:
            coro = self._coro = self._make()
        return coro

    def __await__(self) -> Generator[Any, None, None]:
        return self._started().__await__()

    def send(self, value: Any) -> Any:
        """Run the training coroutine to its next suspension (what a task does)."""
        return self._started().send(value)

    def throw(self, *args: Any) -> Any:
        """Raise an exception inside the training coroutine."""
        return self._started().throw(*args)

    def close(self) -> None:
        """Close the training coroutine; closing an unstarted call trains nothing, silently."""
        self._closed = True
        if self._coro is not None:
            self._coro.close()

    @property
    def cr_code(self) -> Any:
        return getattr(self._coro, "cr_code", None)

    @property
    def cr_frame(self) -> Any:
        return getattr(self._coro, "cr_frame", None)

    @property
    def cr_running(self) -> bool:
        return bool(getattr(self._coro, "cr_running", False))

    @property
    def cr_await(self) -> Any:
        return getattr(self._coro, "cr_await", None)

    def __repr__(self) -> str:
        state = "not awaited" if self._coro is None else "awaited"
        return f"<trainer.fit() call, {state}>"

    def __del__(self) -> None:
        if self._coro is not None or self._closed:
            return
        filename, lineno, module = self._where
        # Under an "error" filter this raises; Python reports an exception from __del__
        # through sys.unraisablehook ("Exception ignored in ..."), which pytest turns into
        # a failure of the test that dropped the call.
        warnings.warn_explicit(_MESSAGE, FitNotAwaitedWarning, filename, lineno, module=module)
