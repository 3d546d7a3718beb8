"""Event filters for handlers: ``@every("10ba")`` and ``@once("100ba")``, as in Ignite.

A filter is checked on the training thread, against the timestamp of the event, before the
handler is queued: a handler that is not due costs nothing (no queue, no thread, no task).
Filters count batches or epochs *completed* as the event sees them, so ``@every("10ba")`` on
``batch_end`` runs after batches 10, 20, ...; on ``batch_start`` it runs before batches 11,
21, ... (when 10, 20, ... are complete). A count of 0 never matches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from trainbus.core.time import Time, TimeUnit, ensure_time
from trainbus.core.timer import Timestamp

__all__ = ["every", "once"]

F = TypeVar("F", bound=Callable[..., Any])

FILTER_ATTR = "__trainbus_when__"


class _When:
    """A predicate on timestamps: the counter of ``unit`` is a multiple of / equal to ``n``."""

    __slots__ = ("attr", "exact", "n", "text")

    def __init__(self, interval: Time[Any] | str | int, *, exact: bool, name: str) -> None:
        time = ensure_time(interval, name=name)
        if time.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or time.value <= 0:
            raise ValueError(
                f"{name}({interval!r}): filters count whole batches or epochs; use a positive "
                "'Nba' or 'Nep' (or an int, for epochs), e.g. '10ba'"
            )
        self.attr = "_batch" if time.unit is TimeUnit.BATCH else "_epoch"
        self.n = int(time.value)
        self.exact = exact
        self.text = f"{name}({time.to_timestring()!r})"

    def __call__(self, ts: Timestamp) -> bool:
        count: int = getattr(ts, self.attr)
        if self.exact:
            return count == self.n
        return count > 0 and count % self.n == 0

    def __repr__(self) -> str:
        return self.text


def _decorator(when: _When) -> Callable[[F], F]:
    def apply(fn: F) -> F:
        setattr(fn, FILTER_ATTR, when)
        return fn

    return apply


def every(interval: Time[Any] | str | int) -> Callable[[F], F]:
    """Run the decorated handler only when ``interval`` divides the completed count.

    Args:
        interval: ``"Nba"`` (batches), ``"Nep"`` or an int (epochs).

    Example:
        >>> class Checkpoint(Callback):
        ...     @every("100ba")
        ...     async def batch_end(self, state, logger):   # after batches 100, 200, ...
        ...         await save(state)
    """
    return _decorator(_When(interval, exact=False, name="every"))


def once(at: Time[Any] | str | int) -> Callable[[F], F]:
    """Run the decorated handler only when the completed count equals ``at``.

    Example:
        >>> class Warmup(Callback):
        ...     @once("1ep")
        ...     def epoch_end(self, state, logger):   # after the first epoch only
        ...         print("warm")
    """
    return _decorator(_When(at, exact=True, name="once"))
