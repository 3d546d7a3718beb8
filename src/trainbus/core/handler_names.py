"""Handler-like method names that match no event: Lightning's ``on_batch_end``, a typo.

A callback method is called only when its name is an event's value (``batch_end``). A
method named like another framework's hook, or one letter off an event, would silently
never run; :func:`warn_unknown_handlers` warns about it when the callback is resolved,
pointing at the method and naming the event method it was probably meant to be.

A logger destination receives its records through one entry point (``log_data``, else
``log_record``, else ``log_metrics``/``log_hyperparameters``);
:func:`warn_uncalled_destination_methods` warns about every other record method it defines
that the entry point does not call, and about Composer destination methods trainbus never
calls (``will_log``, ``log_metric``, ``log_file_artifact``, ``log_symlink_artifact``).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from trainbus.core.events import Event
from trainbus.core.exceptions import UnknownHandlerWarning
from trainbus.core.warn_at import warn_at

__all__ = ["warn_uncalled_destination_methods", "warn_unknown_handlers"]

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


# Composer destination methods that trainbus never calls, and what to do instead.
_COMPOSER_UNCALLED = {
    "will_log": (
        "records are not filtered before they are queued; drop unwanted levels in "
        "log_data (e.g. `if log_level > LogLevel.BATCH: return`)"
    ),
    "log_metric": (
        "it is Composer v0.5's name; rename it to log_data(self, state, log_level, data) "
        "and read the timestamp as state.timestamp"
    ),
    "log_file_artifact": (
        "logger.file_artifact(...) stores each file under <run_name>/artifacts itself "
        "(no destination receives artifacts); take checkpoint files from "
        "CheckpointSaver.add_listener(fn), which hands over each file complete on disk"
    ),
    "log_symlink_artifact": (
        "logger.symlink_artifact(...) links within <run_name>/artifacts itself "
        "(no destination receives artifacts); take checkpoint files from "
        "CheckpointSaver.add_listener(fn), which hands over each file complete on disk"
    ),
}
# The record entry points, most specific first: the first one overridden gets every record.
_ENTRY_POINTS = ("log_data", "log_record", ("log_metrics", "log_hyperparameters"))
_RECORD_METHODS = ("log_data", "log_record", "log_metrics", "log_hyperparameters")


def _defined(callback: object, base: type, name: str) -> tuple[type, Any] | None:
    """``(class, function)`` where ``callback``'s class overrides ``base``'s ``name``."""
    for klass in type(callback).__mro__:
        if klass is base or issubclass(base, klass):
            return None  # reached the base (or above it): not overridden
        if name in vars(klass):
            return klass, vars(klass)[name]
    return None


def _names_used(fn: Any) -> set[str]:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return set(code.co_names) if code is not None else set()


def warn_uncalled_destination_methods(destination: object, base: type) -> None:
    """Warn for each method ``destination`` defines that trainbus will not call.

    ``base`` is ``LoggerDestination``. The first entry point overridden (``log_data``,
    ``log_record``, then ``log_metrics``/``log_hyperparameters``) receives every record; any
    other record method defined is warned about unless the entry point's code refers to it
    (``self.log_metrics(...)``, or ``super().log_record(record)``, which calls
    ``log_metrics``/``log_hyperparameters``). Composer methods trainbus never calls
    (``will_log``, ``log_metric``, the artifact methods) are warned about too.
    """
    defined = {name: _defined(destination, base, name) for name in _RECORD_METHODS}
    entry: tuple[str, ...] = ()
    for point in _ENTRY_POINTS:
        names = point if isinstance(point, tuple) else (point,)
        if any(defined[n] is not None for n in names):
            entry = names
            break
    used: set[str] = set()
    for name in entry:
        found = defined[name]
        if found is not None:
            used |= _names_used(found[1])
    if "super" in used and "log_record" in entry:
        used |= {"log_metrics", "log_hyperparameters"}  # what the base log_record calls
    for name in _RECORD_METHODS:
        found = defined[name]
        if found is None or name in entry or name in used:
            continue
        klass, attr = found
        message = (
            f"{klass.__qualname__}.{name} is never called: {type(destination).__qualname__} "
            f"defines {entry[0]}, which receives every record instead; move its code into "
            f"{entry[0]} (or call self.{name}(...) from there)"
        )
        warn_at(message, UnknownHandlerWarning, attr, stacklevel=4)
    for name, advice in _COMPOSER_UNCALLED.items():
        found = _defined(destination, base, name)
        if found is not None:
            klass, attr = found
            message = f"{klass.__qualname__}.{name} is never called by trainbus: {advice}"
            warn_at(message, UnknownHandlerWarning, attr, stacklevel=4)


def warn_unknown_handlers(callback: object, base: type) -> None:
    """Warn for each method of ``callback`` that looks like a handler but matches no event.

    Methods of trainbus's own base classes and the names ``base`` (``Callback``) defines
    are known; any other public method is checked, in the user's classes and in the
    built-ins alike.
    """
    for klass in type(callback).__mro__:
        own = klass.__module__ == "trainbus" or klass.__module__.startswith("trainbus.core.")
        if own or klass is object:
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
            warn_at(message, UnknownHandlerWarning, attr, stacklevel=4)  # the method's line
