"""Warnings that point at the user's code: the callback or handler they are about.

A warning raised from inside trainbus would name a trainbus file and line, which tells a
user nothing; these name the handler's own ``def`` line (or its class's).
"""

from __future__ import annotations

import inspect
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.bus._lane import Lane
    from trainbus.core.events import Event

__all__ = ["long_wait_message", "warn_at"]

_WAITING_FOR = {
    "barrier": "at the barrier",
    "backpressure": "for room in a callback's queue (queue_size)",
    "records": "for room among logged records (queue_size)",
    "blocking": "to run a @blocking handler",
}


def long_wait_message(kind: str, event: Event | None, lanes: list[Lane], seconds: float) -> str:
    """What the training thread has waited ``seconds`` for: the callbacks and handlers."""
    at = _WAITING_FOR.get(kind, "")
    if event is not None:
        at += f" of Event.{event.name}" if kind == "barrier" else f" at Event.{event.name}"
    names = ", ".join(
        f"{lane.name} (running {lane.current})" if lane.current else lane.name
        for lane in lanes
    )
    return (
        f"the training thread has waited {seconds:g} s {at} for "
        f"{names or 'its callbacks'}; it keeps waiting (Trainer(wait_warning=...) sets "
        "when this warns)"
    )


def warn_at(message: str, category: type[Warning], where: object = None) -> None:
    """Warn as if from ``where``'s definition (a function, method, class or instance)."""
    filename, lineno = _code_location(where)
    if filename is None:
        warnings.warn(message, category, stacklevel=2)
        return
    module = getattr(where, "__module__", None) or type(where).__module__
    warnings.warn_explicit(message, category, filename, lineno, module, {})


def _code_location(obj: object) -> tuple[str | None, int]:
    """Where ``obj`` (a function, a method, a class or an instance's class) is defined."""
    if obj is None:
        return None, 0
    fn = getattr(obj, "__func__", obj)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return code.co_filename, code.co_firstlineno
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None, 0
