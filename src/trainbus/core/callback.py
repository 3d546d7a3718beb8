"""The callback base class, the ``@blocking`` marker and the handler resolver.

A callback has one method per :class:`~trainbus.Event`. The resolver looks at a callback
once, when it is registered, and answers for each event: which callable runs, whether it
is a coroutine function, whether it must run in lockstep with the training thread, and
whether the callback routes everything through an overridden ``run_event``. Events whose
method is not overridden are left out, so a callback pays nothing for events it ignores.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from trainbus.core.events import Event
from trainbus.core.exceptions import CallbackSignatureError
from trainbus.core.filters import FILTER_ATTR
from trainbus.core.handler_names import warn_unknown_handlers
from trainbus.core.serializable import Serializable

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["Callback", "Handler", "HandlerTable", "blocking", "resolve_callback"]

F = TypeVar("F", bound=Callable[..., Any])

_BLOCKING_ATTR = "__trainbus_blocking__"


def blocking(fn: F) -> F:
    """Mark a handler to run in lockstep with the training thread.

    The training thread does not continue past the handler's event until the handler
    has returned, and the handler sees live state, so it may change it (gradient surgery
    between ``after_backward`` and the optimizer step, for example). A plain ``def``
    handler marked ``@blocking`` runs directly on the training thread, which is the
    cheapest way to run a handler at all; an ``async def`` one runs on the event loop
    while the training thread waits.

    Example:
        >>> from trainbus import Callback, blocking
        >>> class ClipGrads(Callback):
        ...     @blocking
        ...     def after_backward(self, state, logger):
        ...         torch.nn.utils.clip_grad_norm_(state.model.parameters(), 1.0)
    """
    setattr(fn, _BLOCKING_ATTR, True)
    return fn


class Callback(Serializable):
    """Base class for callbacks: override the methods of the events you handle.

    Every method may be a plain ``def`` or an ``async def``. Plain methods run on the
    callback's lane thread (one of a bounded pool, never the event loop), coroutines run on
    the event loop;
    either way a callback's handlers run one at a time, in event order, concurrently
    with other callbacks and with training. See ``docs/concurrency.md``.

    Example:
        >>> class PrintEpoch(Callback):
        ...     def epoch_start(self, state, logger):
        ...         print(f"Epoch: {int(state.timer.epoch)}")
        >>> class Upload(Callback):
        ...     async def batch_end(self, state, logger):
        ...         await client.post(url, json={"loss": float(state.loss)})

    Overriding :meth:`run_event` routes every event through it; the per-event methods
    are then not called.

    Attributes:
        rank_zero_only: Under ``torchrun``, whether the callback acts on rank zero only
            (it is then not registered with the engine on the other ranks; see
            :func:`trainbus.rank_zero_only` and ``docs/distributed.md``). ``False`` here;
            ``True`` on the file and network loggers, ``EventStream`` and
            ``CheckpointSaver``. An instance may override its class's value.
        trailing: Batches every handler of this callback may trail training by
            (``@trainbus.trailing(k)`` for all of them at once); ``None`` (the default)
            follows ``Trainer(max_lag=...)``. Declare it only when the handlers read just
            their event's snapshot, never the live model or optimizer.
        own_thread: Whether the plain handlers get a lane thread of their own instead of
            one of the pool's (``Trainer(lane_threads=...)``), which they would share with
            other callbacks: for a callback whose plain handlers block for long (a
            synchronous upload, a sleep), so that it delays no other callback.
    """

    rank_zero_only: bool = False
    trailing: int | None = None
    own_thread: bool = False

    def run_event(self, event: Event, state: State, logger: Logger) -> Any:
        """Handle ``event``; by default, call the method named ``event.value``."""
        return getattr(self, event.value)(state, logger)

    def init(self, state: State, logger: Logger) -> Any:
        """Called once, when the trainer is created (before ``fit_start``)."""

    def fit_start(self, state: State, logger: Logger) -> Any:
        """Called at the start of each ``fit()`` call."""

    def epoch_start(self, state: State, logger: Logger) -> Any:
        """Called at the start of each epoch."""

    def batch_start(self, state: State, logger: Logger) -> Any:
        """Called at the start of each batch, after the data loader produced it."""

    def after_dataloader(self, state: State, logger: Logger) -> Any:
        """Called right after the data loader produced a batch."""

    def before_train_batch(self, state: State, logger: Logger) -> Any:
        """Called before the forward/backward passes of a batch."""

    def before_forward(self, state: State, logger: Logger) -> Any:
        """Called before each (micro)batch's forward pass."""

    def after_forward(self, state: State, logger: Logger) -> Any:
        """Called after each (micro)batch's forward pass; ``state.outputs`` is set."""

    def before_loss(self, state: State, logger: Logger) -> Any:
        """Called before the loss is computed."""

    def after_loss(self, state: State, logger: Logger) -> Any:
        """Called after the loss is computed; ``state.loss`` is set."""

    def before_backward(self, state: State, logger: Logger) -> Any:
        """Called before the backward pass."""

    def after_backward(self, state: State, logger: Logger) -> Any:
        """Called after each (micro)batch's backward pass, before the optimizer step.

        The gradients are summed over the microbatches so far; under fp16 they are still
        multiplied by the grad scaler's scale (unscaled before ``after_train_batch``).
        """

    def after_train_batch(self, state: State, logger: Logger) -> Any:
        """Called after the last backward of a batch, before the optimizer step.

        The gradients are complete, unscaled and clipped, and not yet applied.
        """

    def batch_end(self, state: State, logger: Logger) -> Any:
        """Called after the optimizer and scheduler steps; the timer counts the batch.

        A barrier by default.
        """

    def batch_checkpoint(self, state: State, logger: Logger) -> Any:
        """Called after ``batch_end`` and any batch-wise evaluation; checkpoints are taken here."""

    def epoch_end(self, state: State, logger: Logger) -> Any:
        """Called at the end of each epoch; the timer already counts it."""

    def epoch_checkpoint(self, state: State, logger: Logger) -> Any:
        """Called after ``epoch_end`` and any evaluation, where checkpoints are taken."""

    def eval_start(self, state: State, logger: Logger) -> Any:
        """Called at the start of an evaluation pass."""

    def eval_batch_start(self, state: State, logger: Logger) -> Any:
        """Called at the start of each evaluation batch."""

    def eval_before_forward(self, state: State, logger: Logger) -> Any:
        """Called before each evaluation forward pass."""

    def eval_after_forward(self, state: State, logger: Logger) -> Any:
        """Called after each evaluation forward pass."""

    def eval_batch_end(self, state: State, logger: Logger) -> Any:
        """Called at the end of each evaluation batch."""

    def eval_end(self, state: State, logger: Logger) -> Any:
        """Called at the end of an evaluation pass; eval metrics are in ``state``."""

    def fit_end(self, state: State, logger: Logger) -> Any:
        """Called when training reached its duration or was stopped."""

    def close(self, state: State, logger: Logger) -> Any:
        """Called once per ``fit()`` after the last event, also when training failed.

        Release resources and flush here. All callbacks' ``close`` run concurrently.
        """

    def post_close(self) -> Any:
        """Called once per ``fit()`` after every callback's ``close`` has finished."""


@dataclass(frozen=True, slots=True)
class Handler:
    """What runs for one callback and one event, as the resolver decided.

    Attributes:
        callback: The callback the handler belongs to.
        qualname: ``"Class.method"``, used in errors, warnings and statistics.
        fn: The callable; event handlers take ``(state, logger)``.
        is_async: Whether ``fn`` returns a coroutine to await.
        is_blocking: Whether the training thread waits for it (``@blocking``).
        when: The event filter (``@every``/``@once``): called with the event's timestamp,
            the handler runs only when it returns true.
    """

    callback: Callback
    qualname: str
    fn: Callable[..., Any]
    is_async: bool
    is_blocking: bool
    when: Callable[[Any], bool] | None = None


@dataclass(frozen=True, slots=True)
class HandlerTable:
    """Everything the bus needs to know about one callback, resolved once.

    Attributes:
        callback: The callback.
        name: A display name (the class name).
        handlers: The handler per event, only for events the callback handles.
        overrides_run_event: Whether ``run_event`` is overridden (then it gets every event).
        close: The ``close(state, logger)`` handler, or ``None`` if not overridden.
        post_close: The ``post_close()`` handler, or ``None`` if not overridden.
        extra: Other resolved methods by name (``log_record``, ``background``, ...).
    """

    callback: Callback
    name: str
    handlers: Mapping[Event, Handler]
    overrides_run_event: bool
    close: Handler | None
    post_close: Handler | None
    extra: Mapping[str, Handler]

    @property
    def has_sync(self) -> bool:
        """Whether any non-blocking handler is a plain function (needs a thread)."""
        every = [*self.handlers.values(), *self.extra.values()]
        every += [h for h in (self.close, self.post_close) if h is not None]
        return any(not h.is_async and not h.is_blocking for h in every)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


#: The methods that make an object a logger destination (Composer's and trainbus's).
DESTINATION_METHODS = ("log_data", "log_record", "log_metrics", "log_hyperparameters")


def _refuse_mocks_and_ducks(callback: object, where: str) -> None:
    """Refuse a ``unittest.mock`` object and a duck-typed destination, saying what works.

    A mock (even ``MagicMock(spec=LoggerDestination)``, an instance by ``isinstance``)
    has every attribute, so it would "override" every handler; a plain object with a
    ``log_data`` would be accepted and never called. Both get an error naming
    ``LoggerDestination`` instead (issue 45).
    """
    mock = sys.modules.get("unittest.mock")
    if mock is not None and isinstance(callback, mock.NonCallableMock):
        raise TypeError(
            f"{where} got a unittest.mock object ({callback!r}); trainbus calls only the "
            "handlers a callback overrides, and a mock overrides every one. Wrap the mock "
            "in a subclass that forwards what you check, e.g. `class Spy(LoggerDestination):"
            " def log_data(self, state, log_level, data): mock.log_data(state, log_level, "
            "data)`, passed as loggers=[Spy()] (or use trainbus.InMemoryLogger)"
        )
    if isinstance(callback, Callback | type):
        return
    found = [name for name in DESTINATION_METHODS if callable(getattr(callback, name, None))]
    if found:
        name = type(callback).__qualname__
        raise TypeError(
            f"{where} got {callback!r} (type {name}), which has {found[0]}() but is not a "
            f"trainbus.LoggerDestination, so nothing would call it; subclass it: "
            f"`class {name}(trainbus.LoggerDestination)` (keeping {found[0]}), and pass it "
            "in loggers=[...]"
        )


def _class_attr(klass: type, name: str) -> object:
    """``name`` as ``klass`` defines or inherits it, unbound (what the first class of its
    MRO holding it holds), or ``None``: ``inspect.getattr_static`` for a class attribute,
    without its descriptor and metaclass checks (a tenth of its cost, 1,000 callbacks
    resolve 29,000 names)."""
    for owner in klass.__mro__:
        found = vars(owner)
        if name in found:
            return found[name]
    return None


def _overrides(callback: Callback, name: str, base: type = Callback) -> bool:
    if name in vars(callback):  # assigned on the instance
        return True
    return _class_attr(type(callback), name) is not _class_attr(base, name)


#: The functions whose signature took ``nargs`` arguments, per function: a bound method's
#: check depends on its function alone, so 1,000 instances of one class check it once.
_SIGNATURES_OK: weakref.WeakKeyDictionary[Callable[..., Any], set[int]] = (
    weakref.WeakKeyDictionary()
)


def _check_signature(callback: Callback, name: str, nargs: int, expected: str) -> None:
    method = getattr(callback, name)
    qualname = f"{type(callback).__qualname__}.{name}"
    if not callable(method):
        raise CallbackSignatureError(
            f"{qualname} is {method!r}, not a method; define it as `def {expected}`"
        )
    func = method.__func__ if isinstance(method, types.MethodType) else None
    if func is not None and nargs in _SIGNATURES_OK.get(func, ()):
        return
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        sig.bind(*([None] * nargs))
    except TypeError:
        raise CallbackSignatureError(
            f"{qualname}{sig} cannot be called the way trainbus calls it; "
            f"expected `def {expected}` (or `async def {expected}`)"
        ) from None
    if func is not None:
        try:
            _SIGNATURES_OK.setdefault(func, set()).add(nargs)
        except TypeError:  # a callable that takes no weak reference: checked each time
            pass


def _make_handler(callback: Callback, name: str, fn: Callable[..., Any]) -> Handler:
    method = getattr(callback, name)
    return Handler(
        callback=callback,
        qualname=f"{type(callback).__qualname__}.{name}",
        fn=fn,
        is_async=_is_async(method),
        is_blocking=bool(getattr(method, _BLOCKING_ATTR, False)),
        when=getattr(method, FILTER_ATTR, None),
    )


_EXPECTED = {
    "run_event": (3, "run_event(self, event, state, logger)"),
    "close": (2, "close(self, state, logger)"),
    "post_close": (0, "post_close(self)"),
}


def resolve_callback(
    callback: object,
    *,
    where: str = "callbacks",
    extra: Iterable[tuple[str, type, int, str]] = (),
) -> HandlerTable:
    """Resolve a callback's handlers once, validating their signatures.

    Args:
        callback: The object to resolve; it must be a :class:`Callback`.
        where: How the caller names the argument it came from, for error messages.
        extra: Further methods to resolve when overridden, as
            ``(name, defining base class, number of arguments, expected signature)``.

    Raises:
        TypeError: ``callback`` is not a :class:`Callback` (or is a class, not an instance).
        CallbackSignatureError: A handler cannot take the arguments trainbus passes.

    Warns:
        UnknownHandlerWarning: A method looks like a handler (``on_batch_end``,
            ``batch_ends``) but matches no event; the message names the event method.
    """
    _refuse_mocks_and_ducks(callback, where)
    if isinstance(callback, type) and issubclass(callback, Callback):
        raise TypeError(
            f"{where} got the class {callback.__qualname__}, not an instance; pass an "
            f"instance: {callback.__qualname__}()"
        )
    if not isinstance(callback, Callback):
        raise TypeError(
            f"{where} got {callback!r} (type {type(callback).__qualname__}), which is not a "
            "trainbus.Callback; subclass trainbus.Callback and override the event methods "
            "you need"
        )
    overrides_run_event = _overrides(callback, "run_event")
    handlers: dict[Event, Handler] = {}
    if overrides_run_event:
        _check_signature(callback, "run_event", *_EXPECTED["run_event"])
        run_event = callback.run_event
        for event in Event:
            handlers[event] = _make_handler(
                callback, "run_event", functools.partial(run_event, event)
            )
    else:
        warn_unknown_handlers(callback, Callback)
        for event in Event:
            name = event.value
            if _overrides(callback, name):
                _check_signature(callback, name, 2, f"{name}(self, state, logger)")
                handlers[event] = _make_handler(callback, name, getattr(callback, name))

    def optional(name: str, nargs: int, expected: str, base: type = Callback) -> Handler | None:
        if not _overrides(callback, name, base):
            return None
        _check_signature(callback, name, nargs, expected)
        return _make_handler(callback, name, getattr(callback, name))

    close = optional("close", *_EXPECTED["close"])
    post_close = optional("post_close", *_EXPECTED["post_close"])
    extras: dict[str, Handler] = {}
    for name, base, nargs, expected in extra:
        if isinstance(callback, base):
            handler = optional(name, nargs, expected, base)
            if handler is not None:
                extras[name] = handler
    return HandlerTable(
        callback=callback,
        name=type(callback).__qualname__,
        handlers=handlers,
        overrides_run_event=overrides_run_event,
        close=close,
        post_close=post_close,
        extra=extras,
    )
