"""Handler-like method names that match no event: Lightning's ``on_batch_end``, a typo.

A callback method is called only when its name is an event's value (``batch_end``). A
method named like another framework's hook, or one letter off an event, would silently
never run; :func:`warn_unknown_handlers` warns about it when the callback is resolved,
pointing at the method and naming the event method it was probably meant to be.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from typing import Any

from trainbus.core.events import Event
from trainbus.core.exceptions import UnknownHandlerWarning

__all__ = ["warn_unknown_handlers"]

# Other frameworks' names for the events (PyTorch Lightning's hooks), and the event.
_FOREIGN_NAMES = {
    "on_train_start": "fit_start",
    "on_train_end": "fit_end",
    "on_train_epoch_start": "epoch_start",
    "on_train_epoch_end": "epoch_end",
    "on_train_batch_start": "batch_start",
    "on_train_batch_end": "batch_end",
    "on_validation_start": "eval_start",
    "on_validation_end": "eval_end",
    "on_validation_batch_start": "eval_batch_start",
    "on_validation_batch_end": "eval_batch_end",
    "on_before_optimizer_step": "after_train_batch",
}
_EVENT_NAMES = [event.value for event in Event]


def _takes_state_and_logger(method: Any) -> bool:
    try:
        inspect.signature(method).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


def _meant_event(name: str, method: Any) -> str | None:
    """The event method ``name`` was probably meant to be, or ``None``."""
    if name.startswith("on_"):
        stripped = name[3:]
        if stripped in _EVENT_NAMES or name in _FOREIGN_NAMES:
            return _FOREIGN_NAMES.get(name, stripped)
        close = difflib.get_close_matches(stripped, _EVENT_NAMES, n=1, cutoff=0.8)
        return close[0] if close else None
    close = difflib.get_close_matches(name, _EVENT_NAMES, n=1, cutoff=0.85)
    return close[0] if close and _takes_state_and_logger(method) else None


def warn_unknown_handlers(callback: object, base: type) -> None:
    """Warn for each method of ``callback`` that looks like a handler but matches no event.

    Methods of trainbus's own base classes and the names ``base`` (``Callback``) defines
    are known; any other public method is checked, in the user's classes and in the
    built-ins alike.
    """
    for klass in type(callback).__mro__:
        if klass.__module__.startswith("trainbus._") or klass is object:
            continue  # Callback, LoggerDestination, ...: their methods are all known
        for name, attr in vars(klass).items():
            if name.startswith("_") or name in _EVENT_NAMES or not callable(attr):
                continue
            if inspect.getattr_static(base, name, None) is not None:
                continue
            meant = _meant_event(name, getattr(callback, name))
            if meant is None:
                continue
            message = (
                f"{klass.__qualname__}.{name} matches no event, so trainbus never calls it; "
                f"rename it to {meant} (Event.{Event(meant).name})"
            )
            code = getattr(inspect.unwrap(attr), "__code__", None)
            if code is None:
                warnings.warn(message, UnknownHandlerWarning, stacklevel=4)
            else:  # point at the method itself: that is the line to change
                warnings.warn_explicit(
                    message, UnknownHandlerWarning, code.co_filename, code.co_firstlineno,
                    module=klass.__module__,
                )  # fmt: skip
