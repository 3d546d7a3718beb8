"""Warnings that point at the user's code: the callback or handler they are about.

A warning raised from inside trainbus would name a trainbus file and line, which tells a
user nothing; these name the handler's own ``def`` line (or its class's).
"""

from __future__ import annotations

import inspect
import warnings

__all__ = ["warn_at"]


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
