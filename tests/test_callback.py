"""The resolver: which callable runs for each event, decided once at registration."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback, CallbackSignatureError, Event, blocking
from trainbus.core.callback import resolve_callback


class Sync(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def batch_end(self, state: Any, logger: Any) -> None:
        self.calls.append(("batch_end", state, logger))


class Async(Callback):
    async def epoch_end(self, state: Any, logger: Any) -> None:
        pass


class Blocking(Callback):
    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        pass

    @blocking
    async def before_forward(self, state: Any, logger: Any) -> None:
        pass

    def batch_end(self, state: Any, logger: Any) -> None:
        pass


class RunEventSync(Callback):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.events.append(event)

    def batch_end(self, state: Any, logger: Any) -> None:
        raise AssertionError("per-event methods are not called when run_event is overridden")


class RunEventAsync(Callback):
    async def run_event(self, event: Event, state: Any, logger: Any) -> None:
        pass

    async def epoch_end(self, state: Any, logger: Any) -> None:
        raise AssertionError("per-event methods are not called when run_event is overridden")


class Nothing(Callback):
    pass


class Closing(Callback):
    def close(self, state: Any, logger: Any) -> None:
        pass

    async def post_close(self) -> None:
        pass


# --- what the resolver answers ----------------------------------------------------------------


def test_sync_handler() -> None:
    cb = Sync()
    table = resolve_callback(cb)
    assert set(table.handlers) == {Event.BATCH_END}
    handler = table.handlers[Event.BATCH_END]
    assert handler.callback is cb
    assert handler.qualname == "Sync.batch_end"
    assert handler.is_async is False
    assert handler.is_blocking is False
    handler.fn("state", "logger")
    assert cb.calls == [("batch_end", "state", "logger")]
    assert table.overrides_run_event is False
    assert table.has_sync is True
    assert table.name == "Sync"


def test_async_handler() -> None:
    table = resolve_callback(Async())
    assert set(table.handlers) == {Event.EPOCH_END}
    handler = table.handlers[Event.EPOCH_END]
    assert handler.is_async is True
    assert handler.is_blocking is False
    assert table.has_sync is False


def test_blocking_handlers_sync_and_async() -> None:
    table = resolve_callback(Blocking())
    assert set(table.handlers) == {Event.AFTER_BACKWARD, Event.BEFORE_FORWARD, Event.BATCH_END}
    sync_blocking = table.handlers[Event.AFTER_BACKWARD]
    async_blocking = table.handlers[Event.BEFORE_FORWARD]
    plain = table.handlers[Event.BATCH_END]
    assert (sync_blocking.is_blocking, sync_blocking.is_async) == (True, False)
    assert (async_blocking.is_blocking, async_blocking.is_async) == (True, True)
    assert (plain.is_blocking, plain.is_async) == (False, False)


def test_blocking_returns_the_function_itself() -> None:
    def handler(self: Any, state: Any, logger: Any) -> None:
        pass

    assert blocking(handler) is handler


def test_sync_run_event_override_gets_every_event() -> None:
    cb = RunEventSync()
    table = resolve_callback(cb)
    assert table.overrides_run_event is True
    assert set(table.handlers) == set(Event)
    for handler in table.handlers.values():
        assert handler.qualname == "RunEventSync.run_event"
        assert handler.is_async is False
        handler.fn("state", "logger")  # the event is bound; batch_end is never called
    assert cb.events == list(Event)


def test_async_run_event_override_gets_every_event() -> None:
    table = resolve_callback(RunEventAsync())
    assert table.overrides_run_event is True
    assert set(table.handlers) == set(Event)
    assert all(h.is_async for h in table.handlers.values())
    assert {h.qualname for h in table.handlers.values()} == {"RunEventAsync.run_event"}


def test_run_event_override_on_a_trainer_skips_per_event_methods() -> None:
    cb = RunEventSync()
    make_trainer(n_batches=1, callbacks=[cb]).fit_sync()
    assert Event.BATCH_END in cb.events  # routed to run_event, not batch_end
    assert cb.events[0] is Event.INIT
    assert cb.events[-1] is Event.FIT_END


def test_callback_that_overrides_nothing_has_no_handlers() -> None:
    table = resolve_callback(Nothing())
    assert dict(table.handlers) == {}
    assert table.close is None
    assert table.post_close is None
    assert table.overrides_run_event is False
    assert table.has_sync is False


def test_close_and_post_close_are_detected() -> None:
    cb = Closing()
    table = resolve_callback(cb)
    assert dict(table.handlers) == {}
    assert table.close is not None
    assert table.close.qualname == "Closing.close"
    assert table.close.is_async is False
    assert table.post_close is not None
    assert table.post_close.qualname == "Closing.post_close"
    assert table.post_close.is_async is True


def test_handler_assigned_on_the_instance_is_resolved() -> None:
    cb = Nothing()
    seen: list[int] = []
    cb.batch_end = lambda state, logger: seen.append(1)  # type: ignore[method-assign]
    table = resolve_callback(cb)
    assert set(table.handlers) == {Event.BATCH_END}
    table.handlers[Event.BATCH_END].fn(None, None)
    assert seen == [1]


def test_inherited_override_is_resolved() -> None:
    class Child(Sync):
        pass

    table = resolve_callback(Child())
    assert set(table.handlers) == {Event.BATCH_END}
    assert table.handlers[Event.BATCH_END].qualname.endswith(".batch_end")


# --- the default run_event --------------------------------------------------------------------


def test_default_run_event_dispatches_to_the_event_method() -> None:
    cb = Sync()
    cb.run_event(Event.BATCH_END, "the state", "the logger")
    assert cb.calls == [("batch_end", "the state", "the logger")]


def test_default_run_event_calls_base_no_op_for_unhandled_events() -> None:
    cb = Sync()
    assert cb.run_event(Event.EPOCH_START, None, None) is None
    assert cb.calls == []


# --- construction-time errors -----------------------------------------------------------------


def test_resolve_rejects_a_non_callback_naming_it() -> None:
    thing = object()
    with pytest.raises(TypeError, match=re.escape(repr(thing))) as info:
        resolve_callback(thing)
    assert "trainbus.Callback" in str(info.value)
    assert not isinstance(info.value, CallbackSignatureError)


def test_trainer_rejects_a_non_callback_naming_it() -> None:
    thing = object()
    with pytest.raises(TypeError, match=re.escape(repr(thing))) as info:
        make_trainer(callbacks=[thing])
    assert "callbacks[0]" in str(info.value)


def test_trainer_rejects_a_non_callback_in_loggers_naming_it() -> None:
    thing = object()
    with pytest.raises(TypeError, match=re.escape(repr(thing))) as info:
        make_trainer(loggers=[thing])
    assert "loggers[0]" in str(info.value)


def test_trainer_rejects_a_plain_callback_in_loggers() -> None:
    with pytest.raises(TypeError, match=r"loggers\[0\].*Sync.*LoggerDestination"):
        make_trainer(loggers=[Sync()])


class WrongBatchEnd(Callback):
    def batch_end(self, state: Any) -> None:
        pass


class WrongAsyncEpochEnd(Callback):
    async def epoch_end(self) -> None:
        pass


class WrongRunEvent(Callback):
    def run_event(self, event: Any) -> None:  # type: ignore[override]
        pass


class WrongClose(Callback):
    def close(self) -> None:  # type: ignore[override]
        pass


class WrongPostClose(Callback):
    def post_close(self, x: Any) -> None:  # type: ignore[override]
        pass


class NotCallable(Callback):
    batch_end = 3  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("cls", "qualname", "expected"),
    [
        (WrongBatchEnd, "WrongBatchEnd.batch_end", "def batch_end(self, state, logger)"),
        (WrongAsyncEpochEnd, "WrongAsyncEpochEnd.epoch_end", "def epoch_end(self, state, logger)"),
        (WrongRunEvent, "WrongRunEvent.run_event", "def run_event(self, event, state, logger)"),
        (WrongClose, "WrongClose.close", "def close(self, state, logger)"),
        (WrongPostClose, "WrongPostClose.post_close", "def post_close(self)"),
        (NotCallable, "NotCallable.batch_end", "def batch_end(self, state, logger)"),
    ],
)
def test_wrong_signature_names_method_and_expected_signature(
    cls: type[Callback], qualname: str, expected: str
) -> None:
    with pytest.raises(CallbackSignatureError) as info:
        resolve_callback(cls())
    message = str(info.value)
    assert qualname in message
    assert expected in message
    assert isinstance(info.value, TypeError)


def test_trainer_raises_signature_error_at_construction() -> None:
    with pytest.raises(CallbackSignatureError, match=r"WrongBatchEnd\.batch_end"):
        make_trainer(callbacks=[WrongBatchEnd()])


def test_flexible_signatures_are_accepted() -> None:
    class Flexible(Callback):
        def batch_end(self, *args: Any) -> None:
            pass

        def epoch_end(self, state: Any, logger: Any, extra: int = 0) -> None:
            pass

        def post_close(self, *args: Any, **kwargs: Any) -> None:
            pass

    table = resolve_callback(Flexible())
    assert set(table.handlers) == {Event.BATCH_END, Event.EPOCH_END}
    assert table.post_close is not None


def test_a_signature_checked_once_still_refuses_every_other_function() -> None:
    # Checks of a bound method are remembered per function (1,000 instances of a class
    # check it once); a subclass's own method, a handler set on an instance, and the same
    # function asked for another number of arguments are each checked afresh.
    class Good(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            pass

    class BadChild(Good):
        def batch_end(self) -> None:  # type: ignore[override]
            pass

    for _ in range(2):
        assert Event.BATCH_END in resolve_callback(Good()).handlers
    with pytest.raises(CallbackSignatureError, match=r"BadChild\.batch_end"):
        resolve_callback(BadChild())
    on_instance = Good()
    on_instance.batch_end = lambda: None  # type: ignore[method-assign]
    with pytest.raises(CallbackSignatureError, match=r"Good\.batch_end"):
        resolve_callback(on_instance)

    class GoodClose(Callback):
        def close(self, state: Any, logger: Any) -> None:
            pass

    class PostCloseIsClose(GoodClose):
        post_close = GoodClose.close  # checked for close's 2 arguments, not post_close's 0

    assert resolve_callback(GoodClose()).close is not None
    with pytest.raises(CallbackSignatureError, match=r"post_close"):
        resolve_callback(PostCloseIsClose())
