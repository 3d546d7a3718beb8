"""``@trailing(k)``: a handler that reads only its event's snapshot may trail training.

By default every handler is in step with the ``BATCH_END`` barrier: what a callback does for
batch *n* is done before batch *n+1* starts (D4). A handler that only reads the snapshot of
its own event (the timer, ``state.loss``, ``state.outputs``, its logger's records) and never
the live model or optimizer gains nothing from that lockstep. Declaring it ``@trailing(k)``
lets the training thread run up to *k* batches ahead of it; barriers wait for it only *k*
batches later, and close waits for all of it.

``@trailing`` is the one declaration that lets a handler run while the training thread
computes the next batches (the live fence, ``docs/concurrency.md``): a trailing handler that
reads ``state.model`` or ``state.optimizers`` tensors races training (torch does not make
that safe: the process may crash). ``max_lag`` alone never lets a handler cross the fence.
On the events whose point is live tensors (:data:`LIVE_TENSOR_EVENTS`) a ``@trailing``
handler is refused when the callback is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from trainbus.core.events import Event

if TYPE_CHECKING:
    from trainbus.core.callback import Handler

__all__ = ["LIVE_TENSOR_EVENTS", "declared_lag", "lag_of", "refuse_live_trailing", "trailing"]

#: The events whose handlers exist to read live tensors (outputs with their graph, the
#: loss, the gradients before the step): a handler of these may not be ``@trailing``.
LIVE_TENSOR_EVENTS: frozenset[Event] = frozenset({
    Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS, Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH,
})

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
    ``state.batch``, ``state.outputs``, ``state.loss``, the values they log) and do I/O
    with it: uploads, writing files, notifying services. It is the declaration that the
    handler never reads the live model or optimizer: a trailing handler that reads
    ``state.model`` or ``state.optimizers`` tensors (``p.grad``, weights, optimizer
    state) races the training thread, which zeroes, accumulates and steps them meanwhile;
    torch does not make that safe and the process may crash. For those reads use a
    handler without ``@trailing`` (it finishes before the next batch's gradients are
    zeroed, whatever ``max_lag`` says) or ``@blocking``. A ``@trailing`` handler of an
    event in :data:`LIVE_TENSOR_EVENTS` (``after_backward``, ``after_train_batch``, ...)
    is refused when the trainer is built. They then overlap with the next batches instead of
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


def declared_lag(handler: Handler) -> int | None:
    """The batches ``handler`` is declared to trail by: its own ``@trailing``, else its
    callback's ``trailing``; ``None`` when neither declares it."""
    method_name = handler.qualname.rpartition(".")[2]
    method = getattr(type(handler.callback), method_name, None)
    own = getattr(method, _ATTR, None)
    if own is not None:
        return int(own)
    declared = getattr(handler.callback, "trailing", None)
    if declared is not None:
        return _check(declared, f"{handler.callback.__class__.__qualname__}.trailing")
    return None


def lag_of(handler: Handler, default: int) -> int:
    """The batches ``handler`` may trail by: its own ``@trailing``, its callback's, or
    ``default`` (the trainer's ``max_lag``)."""
    declared = declared_lag(handler)
    return default if declared is None else declared


def refuse_live_trailing(handler: Handler, event: Event, lag: int | None, where: str) -> None:
    """Refuse a ``@trailing`` handler of an event whose point is live tensors.

    Raises:
        ValueError: ``lag`` (the handler's declared lag) is over 0 and ``event`` is one of
            :data:`LIVE_TENSOR_EVENTS`; the message names the callback, the handler and the
            fix.
    """
    if not lag or event not in LIVE_TENSOR_EVENTS:
        return
    cls = handler.callback.__class__.__qualname__
    method = handler.qualname.rpartition(".")[2]
    own = getattr(getattr(type(handler.callback), method, None), _ATTR, None) is not None
    how = f"@trailing({lag})" if own else f"trailing = {lag} (on the class)"
    raise ValueError(
        f"{where} ({cls}): {handler.qualname} handles Event.{event.name} and is declared "
        f"{how}: a trailing handler runs while the training thread zeroes, accumulates and "
        f"steps the model's gradients and weights, and Event.{event.name}'s handlers exist "
        "to read those live tensors (a race torch does not make safe). Fix: drop the "
        f"trailing declaration from {handler.qualname} (it then finishes before the next "
        "batch's gradients are zeroed, even under max_lag), or make it @blocking; or copy "
        "the values it needs there and do the slow part in a @trailing batch_end handler"
    )
