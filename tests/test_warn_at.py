"""Warnings shown at the user's code (``src/trainbus/core/warn_at.py``)."""

from __future__ import annotations

import functools
import warnings

import pytest

from trainbus.core.warn_at import report_at, warn_at


class Handlers:
    def batch_end(self, state: object, logger: object) -> None:
        pass


def _decorated(fn):  # type: ignore[no-untyped-def]
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, **kwargs)

    return wrapper


@_decorated
def wrapped_handler() -> None:
    pass


def test_warn_at_points_at_the_method_definition() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at("slow", UserWarning, Handlers().batch_end)
    (warning,) = caught
    code = Handlers.batch_end.__code__
    assert (warning.filename, warning.lineno) == (code.co_filename, code.co_firstlineno)


def test_warn_at_follows_a_decorator_to_the_users_function() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at("slow", UserWarning, wrapped_handler)
    assert caught[0].lineno == wrapped_handler.__wrapped__.__code__.co_firstlineno  # type: ignore[attr-defined]


def test_warn_at_an_instance_points_at_its_class() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at("slow", UserWarning, Handlers())
    assert caught[0].filename == __file__
    assert caught[0].lineno < Handlers.batch_end.__code__.co_firstlineno


def test_warn_at_raises_under_an_error_filter() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="stuck"):
            warn_at("stuck", UserWarning, Handlers.batch_end)


def test_report_at_shows_instead_of_raising_under_an_error_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown: list[tuple[str, str, int]] = []
    monkeypatch.setattr(
        warnings,
        "showwarning",
        lambda message, category, filename, lineno, *rest: shown.append(
            (str(message), filename, lineno)
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report_at("measured: slower than its batches", UserWarning, Handlers.batch_end)
    code = Handlers.batch_end.__code__
    assert shown == [("measured: slower than its batches", code.co_filename, code.co_firstlineno)]
