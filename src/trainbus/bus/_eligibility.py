"""Which plain and ``async def`` handlers are cheap enough for the inline fast path.

The policy ``_inline.py`` applies (its module docstring): a handler is *cheap*
(``slot.inline_ok``) once its calls took at most ``inline_max`` seconds; :func:`learn`
updates the verdict after each call that is judged, :func:`ban` takes an ``async def``
handler that suspended off the path for good.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.bus._slot import Slot

__all__ = ["RETRY_AFTER", "RETRY_MAX", "STRIKE_OUT", "ban", "learn"]

#: A call this many times over ``inline_max`` bans its handler from the fast path at once.
STRIKE_OUT = 10
#: Calls a handler banned for slowness sits out before a call judges it again; doubled at
#: each further ban, up to ``RETRY_MAX``.
RETRY_AFTER = 64
RETRY_MAX = 1 << 16


def learn(slot: Slot, elapsed: float, inline_max: float) -> None:
    """Update a handler's eligibility after a call that took ``elapsed`` seconds (an
    ``async def`` one: a call that finished without suspending).

    A handler banned for slow calls sits out ``RETRY_AFTER`` calls, then the next call
    judges it afresh; each new ban doubles the wait (at most ``RETRY_MAX`` calls). A
    preempted cheap handler (a loaded machine) so comes back, and a slow one costs
    nothing: it runs where it did, and only a fast call takes it back.
    """
    if not inline_max or slot.is_blocking:
        return
    if slot.inline_banned:
        if slot.inline_wait:  # sitting out (or, below zero, for good: it suspends)
            if slot.inline_wait > 0:
                slot.inline_wait -= 1
            return
        slot.inline_banned = False  # judged again from this call on
    if elapsed <= inline_max:
        slot.inline_ok = True
        slot.inline_strike = False
    elif slot.inline_strike or elapsed > STRIKE_OUT * inline_max:
        slot.inline_ok = False
        slot.inline_banned = True
        slot.inline_strike = False
        slot.inline_wait = min(RETRY_AFTER << slot.inline_bans, RETRY_MAX)
        slot.inline_bans += 1
    else:  # once just over the limit: a preempted thread, or the handler's first slow call
        slot.inline_strike = True


def ban(slot: Slot) -> None:
    """Take an ``async def`` handler that suspended (it does I/O) off the fast path for good:
    the loop is woken for it at once, every time."""
    slot.inline_ok = False
    slot.inline_banned = True
    slot.inline_wait = -1
