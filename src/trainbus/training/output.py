"""What a fit shows by default: progress, the time account's metrics, its end-of-fit table.

SPEC section 4: "A fit shows progress and ends with a short account of where its time went,
unless ``progress=False``." The Trainer resolves its ``progress`` argument here
(:func:`progress_on`: the argument, else ``TRAINBUS_PROGRESS``, else on), adds the callbacks
that show it (:func:`default_output`: a :class:`~trainbus.callbacks.ProgressBar` unless the
user passed one, so there are never two bars, and the :class:`~trainbus.training.account.
TimeMetrics` that logs ``time/...``), and prints the account when the fit returns
(:func:`print_account`, to the progress bar's stream).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from trainbus.core.callback import Callback
    from trainbus.training.account import TimeAccount

__all__ = ["ENV", "default_output", "print_account", "progress_on"]

#: The environment variable that turns the default output off (``0``) for CI.
ENV = "TRAINBUS_PROGRESS"
_OFF = ("0", "false", "no", "off")
_ON = ("", "1", "true", "yes", "on")


def progress_on(progress: bool | None) -> bool:
    """Whether a fit shows its progress and account: ``progress``, else the environment's
    ``TRAINBUS_PROGRESS``, else ``True``."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise TypeError(
                f"progress={progress!r} must be True, False or None (None: on unless "
                f"{ENV}=0 is set)"
            )
        return progress
    value = os.environ.get(ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError(
        f"{ENV}={os.environ[ENV]!r} is not understood; set it to 0 to turn the progress "
        "output off, 1 to turn it on"
    )


def default_output(
    callbacks: Sequence[object],
    *,
    progress: bool,
    track_time: bool,
    account: Callable[[], TimeAccount | None],
) -> list[Callback]:
    """The callbacks a fit adds to show its progress and log its account (none when
    ``progress`` is off): a ``ProgressBar`` unless ``callbacks`` hold one, and, with the
    account kept, ``TimeMetrics``."""
    if not progress:
        return []
    from trainbus.callbacks.progress_bar import ProgressBar
    from trainbus.training.account import TimeMetrics

    added: list[Callback] = []
    if not any(isinstance(cb, ProgressBar) for cb in callbacks):
        added.append(ProgressBar())
    if track_time:
        added.append(TimeMetrics(account))
    return added


def _stream(callbacks: Sequence[object]) -> TextIO:
    from trainbus.callbacks.progress_bar import ProgressBar

    for cb in callbacks:
        if isinstance(cb, ProgressBar) and cb.stream is not None:
            return cb.stream
    return sys.stderr


def print_account(acct: TimeAccount, callbacks: Sequence[Any]) -> None:
    """Write the account's table where the progress went (the bar's stream, else stderr)."""
    stream = _stream(callbacks)
    stream.write(acct.table() + "\n")
    stream.flush()
