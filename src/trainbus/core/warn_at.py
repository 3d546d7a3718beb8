"""Warnings shown at the user's code: the line to change, not trainbus's.

:func:`warn_at` points a warning at where a function, method or class is defined (a
handler that is slow or stuck, a method no event calls). :func:`report_at` does the same
but never raises: a warning drawn from measured time is shown even where a filter makes
warnings errors, because measured time never changes what a run does (D7).
"""

from __future__ import annotations

import inspect
import warnings

__all__ = ["report_at", "warn_at"]


def warn_at(
    message: str, category: type[Warning], where: object = None, *, stacklevel: int = 2
) -> None:
    """Warn as if from ``where``'s definition (a function, method, class or instance);
    where that is unknown, from the frame ``stacklevel`` levels up, as ``warnings.warn``."""
    filename, lineno = _code_location(where)
    if filename is None:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
        return
    module = getattr(where, "__module__", None) or type(where).__module__
    warnings.warn_explicit(message, category, filename, lineno, module, {})


def report_at(message: str, category: type[Warning], where: object = None) -> None:
    """Warn as :func:`warn_at` does, but never raise: where a filter says "error", the
    warning is shown instead. A deadline the user set (``close_timeout``) is no
    measurement: use :func:`warn_at`."""
    try:
        warn_at(message, category, where)
    except Warning as exc:
        filename, lineno = _code_location(where)
        warnings.showwarning(exc, type(exc), filename or "<trainbus>", lineno)


def _code_location(obj: object) -> tuple[str | None, int]:
    """Where ``obj`` (a function, a method, a class or an instance's class) is defined."""
    if obj is None:
        return None, 0
    fn = inspect.unwrap(getattr(obj, "__func__", obj))  # type: ignore[arg-type]
    code = getattr(fn, "__code__", None)
    if code is not None:
        return code.co_filename, code.co_firstlineno
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None, 0
