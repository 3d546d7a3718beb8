"""What the Lightning and Hugging Face bridges share: the Bus's options, and a host's start.

A bridge takes the :class:`~trainbus.Bus`'s scheduling options as keywords
(:class:`BusKeywords`) and hands them on unchanged, so an option added to the Bus reaches
both bridges without a line in either. :func:`start_hosted` is a host loop's first
hook: under the bridge's ``fit``/``train`` the bus hosts the run (the handlers overlap
training); called as the library's plain ``fit()``/``train()`` the bridge publishes each
event's handlers before the library goes on ("direct": nothing overlaps), and closes the
callbacks itself at the end.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from trainbus.core.events import Event
from trainbus.core.exceptions import EngineThreadError
from trainbus.integrations.loop import Bus

__all__ = ["BusKeywords", "start_hosted"]


class BusKeywords(TypedDict, total=False):
    """The :class:`~trainbus.Bus`'s scheduling options, as a bridge accepts them."""

    barriers: Iterable[Event | str]
    max_lag: int
    queue_size: int
    warn_slow_callbacks: bool
    warn_slow: bool  # deprecated: warn_slow_callbacks
    close_timeout: float | None
    wait_warning_seconds: float | None
    wait_warning: float | None  # deprecated: wait_warning_seconds
    lane_threads: int | None


def start_hosted(bus: Bus, *, call: str, alternative: str) -> bool:
    """Publish ``INIT`` (once) and ``FIT_START`` from a host's first hook; return ``direct``.

    ``direct`` is whether the host was called on its own (``trainer.fit()``), not under
    :meth:`Bus.host`: then this starts the fit's state (forgets an old stop request) and the
    caller closes the bus (``bus.close()``) after ``FIT_END``. Fill the state before calling
    it.

    Raises:
        EngineThreadError: The host runs on an event loop's thread; the message says to
            use ``alternative`` (``call`` names what the user called).
    """
    direct = not bus.hosting
    if direct:
        bus.state.begin_fit()  # bus.host() does it for a hosted run
    try:
        bus.publish_start()
    except EngineThreadError as exc:
        raise EngineThreadError(
            f"{call} was called on a thread that runs an event loop, with a "
            f"TrainbusCallback: use `{alternative}` there"
        ) from exc
    return direct

