"""A destination that is not a ``LoggerDestination`` is refused, naming what works (issue 45).

Composer's tests (and many users) pass a ``MagicMock`` or a plain object with ``log_data``
as a destination. trainbus calls only the handlers a callback overrides, so such an object
would receive nothing: it is refused when the trainer is built, with an error naming
``LoggerDestination`` (a mock, which "overrides" every method, is refused as a mock, with the
forwarding subclass that works instead). Composer's ``trainer.logger.destinations = (d,)``
says to pass ``Trainer(loggers=[...])``.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

import pytest

from tests.helpers import make_trainer
from trainbus import LoggerDestination


class PlainLogData:
    def log_data(self, state: Any, log_level: Any, data: dict[str, Any]) -> None:
        raise AssertionError("never called: refused before the run")


class PlainLogMetrics:
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        raise AssertionError("never called: refused before the run")


@pytest.mark.parametrize("where", ["loggers", "callbacks"])
@pytest.mark.parametrize("dest", [PlainLogData(), PlainLogMetrics()], ids=type)
def test_a_plain_object_with_a_destination_method_is_refused_naming_logger_destination(
    where: str, dest: object
) -> None:
    with pytest.raises(TypeError, match=rf"{where}\[0\] got .* but is not a "
                       r"trainbus\.LoggerDestination.*subclass it"):
        make_trainer(**{where: [dest]})


@pytest.mark.parametrize("where", ["loggers", "callbacks"])
@pytest.mark.parametrize(
    "mock", [MagicMock(), MagicMock(spec=LoggerDestination)], ids=["bare", "spec"]
)
def test_a_mock_is_refused_with_the_forwarding_subclass_that_works(
    where: str, mock: MagicMock
) -> None:
    with pytest.raises(TypeError, match=r"unittest\.mock object.*class Spy\(LoggerDestination\)"):
        make_trainer(**{where: [mock]})
    assert mock.method_calls == []


def test_the_forwarding_subclass_the_error_names_receives_composers_calls() -> None:
    mock = MagicMock()

    class Spy(LoggerDestination):
        def log_data(self, state: Any, log_level: Any, data: dict[str, Any]) -> None:
            mock.log_data(state, log_level, data)

    make_trainer(n_batches=2, loggers=[Spy()]).fit_sync()
    logged = [call.args[2] for call in mock.log_data.call_args_list]
    assert [set(data) for data in logged] == [{"loss/train"}, {"loss/train"}]


def test_assigning_logger_destinations_says_to_pass_loggers() -> None:
    trainer = make_trainer()
    with pytest.raises(AttributeError, match=r"Trainer\(loggers=\[dest, \.\.\.\]\)"):
        trainer.logger.destinations = (PlainLogData(),)  # type: ignore[misc]
