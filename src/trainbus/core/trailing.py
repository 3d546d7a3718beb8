"""``@trailing(k)``: a handler that reads only its event's snapshot may trail training.

By default every handler is in step with the ``BATCH_END`` barrier: what a callback does for
batch *n* is done before batch *n+1* starts (D4). A handler that only reads the snapshot of
its own event (the timer, ``state.loss``, ``state.outputs``, its logger's records) and never
the live model or optimizer gains nothing from that lockstep. Declaring it ``@trailing(k)``
lets the training thread run up to *k* batches ahead of it; barriers wait for it only *k*
batches later, and close waits for all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from trainbus.core.callback import Handler

__all__ = ["lag_of", "trailing"]

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__trainbus_trailing__"


def _check(batches: object, where: str) -> int:
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
        raise ValueError(
            f"{where}={batches!r} must be an int >= 0 (batches the handler may trail "
            "training by), e.g. 2"
        )
    return batches


def trailing(batches: int) -> Callable[[F], F]:
    """Let a handler trail the training thread by up to ``batches`` batches.

    Use it on handlers that read only their event's snapshot (``state.timer``,
    ``state.loss``, ``state.outputs``, ``state.batch``) and do I/O with it: uploads,
    writing files, notifying services. They then overlap with the next batches instead of
    holding the ``BATCH_END`` barrier, whatever ``Trainer(max_lag=...)`` says; every other
    handler stays in lockstep. The bound holds: at the barrier of batch *n* the training
    thread waits for what such a handler received up to batch *n - batches*; backpressure
    (``queue_size``) still applies, a callback's handlers still run one at a time in order,
    and close waits for all of it.

    To declare every handler of a callback, set the class attribute ``trailing = k``.

    Example:
        >>> class Upload(Callback):
        ...     @trailing(2)
        ...     async def batch_end(self, state, logger):
        ...         await client.post(url, json={"batch": int(state.timer.batch)})

    Raises:
        ValueError: ``batches`` is not an int >= 0.
    """
    _check(batches, "trailing(batches)")

    def mark(fn: F) -> F:
        setattr(fn, _ATTR, batches)
        return fn

    return mark


def lag_of(handler: Handler, default: int) -> int:
    """The batches ``handler`` may trail by: its own ``@trailing``, its callback's, or
    ``default`` (the trainer's ``max_lag``)."""
    method_name = handler.qualname.rpartition(".")[2]
    method = getattr(type(handler.callback), method_name, None)
    own = getattr(method, _ATTR, None)
    if own is not None:
        return int(own)
    declared = getattr(handler.callback, "trailing", None)
    if declared is not None:
        return _check(declared, f"{handler.callback.__class__.__qualname__}.trailing")
    return default
