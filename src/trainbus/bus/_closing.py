"""Closing a session: ``close`` and ``post_close`` in lane order, every wait bounded.

Each call runs as the next item of its callback's lane, so it runs after everything the
lane had queued (close is a barrier). Every wait on user code here is bounded by
``close_timeout`` (a callback's own ``close_timeout`` plus a margin when longer): a callback
that misses it is reported and abandoned, and every other callback still closes. After
``wait_warning`` seconds a warning names what a close still waits for. A second Ctrl-C
(:meth:`Closing.abandon`) cuts every bounded wait to ``ABANDON_TIMEOUT``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.bus._items import CallItem
from trainbus.core.exceptions import CallbackTimeoutWarning

if TYPE_CHECKING:
    from collections.abc import Sequence

    from trainbus.bus._lane import Lane
    from trainbus.bus._options import BusOptions
    from trainbus.core.callback import Handler
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["ABANDON_TIMEOUT", "OWN_TIMEOUT_MARGIN", "Closing"]

#: Seconds each callback still gets to close after a second Ctrl-C (``abandon``).
ABANDON_TIMEOUT = 2.0
#: Seconds added to a callback's own ``close_timeout`` (its retries) before it is abandoned.
OWN_TIMEOUT_MARGIN = 5.0


class Closing:
    """The bounded calls of one session's close (loop thread)."""

    def __init__(
        self,
        state: State,
        logger: Logger,
        lanes: Sequence[Lane],
        options: BusOptions,
        emit: Callable[[str, type[Warning], object], None],
    ) -> None:
        self.state = state
        self.logger = logger
        self.lanes = lanes
        self.options = options
        self.emit = emit
        #: Scopes of the waits that close_timeout bounds; a second Ctrl-C ends them at once.
        self.bounded_scopes: set[anyio.CancelScope] = set()
        self.abandoning = False

    def submit(
        self, lane: Lane, fn: Callable[[], Any], is_async: bool, label: str = ""
    ) -> tuple[anyio.Event, list[BaseException]]:
        """Queue ``fn`` as the next item of ``lane``; return its done event and error box."""
        finished = anyio.Event()
        box: list[BaseException] = []

        def on_done(error: BaseException | None) -> None:
            if error is not None:
                box.append(error)
            finished.set()

        lane.pending.append(CallItem(fn, is_async, on_done, label))
        lane.wake()
        return finished, box

    async def bounded(self, lane: Lane, fn: Callable[[], Any], is_async: bool, what: str) -> None:
        """Run ``fn`` in ``lane`` within ``close_timeout``; abandon the lane if it misses it.

        After ``wait_warning`` seconds a warning names what it still waits for.
        """
        timeout = self.timeout(lane)
        finished, box = self.submit(lane, fn, is_async, what)
        with anyio.move_on_after(timeout) as scope:
            self.bounded_scopes.add(scope)
            with anyio.move_on_after(min(self.options.wait_warning, timeout)):
                await finished.wait()
            if not finished.is_set():
                doing = what or lane.current or "what it had queued"
                self.emit(
                    f"closing has waited {self.options.wait_warning:g} s for callback "
                    f"{lane.name} ({doing}); it is abandoned after {timeout:g} s "
                    "(close_timeout)",
                    CallbackTimeoutWarning,
                    lane.member.table.callback,
                )
                await finished.wait()
        self.bounded_scopes.discard(scope)
        if scope.cancelled_caught:
            lane.abandoned = True
            doing = what or lane.current or "what it had queued"
            if lane.scope is not None:
                lane.scope.cancel()
            self.warn_stuck(f"callback {lane.name}", doing, lane.member.table.callback, lane)
        elif box:
            raise box[0]

    def timeout(self, lane: Lane | None = None) -> float:
        """The deadline for ``lane``'s close: ``close_timeout``, or longer when the callback
        has its own ``close_timeout`` (an uploader retrying that long) plus a margin."""
        if self.abandoning:
            return ABANDON_TIMEOUT
        timeout = self.options.close_timeout
        own = getattr(lane.member.table.callback, "close_timeout", None) if lane else None
        if isinstance(own, int | float) and not isinstance(own, bool):
            timeout = max(timeout, float(own) + OWN_TIMEOUT_MARGIN)
        return timeout

    def abandon(self) -> None:
        """Cut every bounded wait now, and later ones to ``ABANDON_TIMEOUT`` (loop)."""
        self.abandoning = True
        now = anyio.current_time()
        for scope in self.bounded_scopes:
            scope.deadline = min(scope.deadline, now)

    async def drain(self) -> None:
        """Wait until every lane has run everything queued so far (or was abandoned)."""
        async with anyio.create_task_group() as tg:
            for lane in self.lanes:
                if not lane.abandoned:
                    tg.start_soon(self.bounded, lane, _noop, False, "")

    async def close_callbacks(self) -> list[BaseException]:
        """Run every ``close`` (destinations last), then every ``post_close``.

        Each runs on its callback's lane, after what the lane had queued (close is a
        barrier), within ``close_timeout``. Returns the exceptions raised, each with a
        note naming its callback; one failing or stuck ``close`` does not stop the others.
        """
        errors: list[BaseException] = []
        await self.drain()

        async def call(lane: Lane, handler: Handler, *args: Any) -> None:
            try:
                await self.bounded(
                    lane, lambda: handler.fn(*args), handler.is_async, handler.qualname
                )
            except BaseException as exc:
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise
                exc.add_note(f"raised by {handler.qualname}")
                errors.append(exc)

        for destinations in (False, True):  # callbacks first, then destinations
            async with anyio.create_task_group() as tg:
                for lane in self.lanes:
                    close = lane.member.table.close
                    is_dest = lane.log_slot is not None
                    if close is not None and is_dest is destinations and not lane.abandoned:
                        tg.start_soon(call, lane, close, self.state, self.logger)
        async with anyio.create_task_group() as tg:
            for lane in self.lanes:
                post = lane.member.table.post_close
                if post is not None and not lane.abandoned:
                    tg.start_soon(call, lane, post)
        return errors

    def warn_stuck(
        self, who: str, what: str, where: object = None, lane: Lane | None = None
    ) -> None:
        when = (
            "by the second Ctrl-C"
            if self.abandoning
            else f"within {self.timeout(lane):g} s (close_timeout)"
        )
        self.emit(
            f"{who} did not finish {what} {when} and was abandoned; a thread stuck in a "
            "plain handler is left running as a daemon. The other callbacks were closed.",
            CallbackTimeoutWarning,
            where,
        )


def _noop() -> None:
    return None
