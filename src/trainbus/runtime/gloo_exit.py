"""At exit, let gloo's worker threads drop their last collective before Python finalizes.

This avoids a torch bug (https://github.com/pytorch/pytorch/issues/190489; an ``atexit``
fix inside torch, https://github.com/pytorch/pytorch/pull/179291, was abandoned): a gloo
worker thread drops its reference to a finished collective's work (and so to the work's
tensors) only *after* it has woken the caller, while holding no GIL. When Python has
already dropped its own references to those tensors (the caller returned and its locals are
gone), that last release frees their Python objects and takes the GIL. If the interpreter
has begun to finalize by then, CPython before 3.14 ends the thread with ``pthread_exit``,
which unwinds through the work's ``noexcept`` destructor: ``std::terminate``, "terminate
called without an active exception", ``SIGABRT``, and ``torchrun`` reports a failed rank
although the script ran to its end. A script whose last collective completes a millisecond
before it exits (``get_state_dict(..., full_state_dict=True)`` to write the full model,
then ``destroy_process_group()``) hits it whenever that worker thread is not scheduled in
time (on a busy machine: 1 launch in 20 to 2 in 5 here). ``destroy_process_group()`` does
not help: gloo groups have no shutdown, and a group lives on (its threads too) while
anything holds it (an FSDP model does; in our runs the default group always outlived
``main()``).

Nothing signals the end of that release (the work is complete; no Python object tracks
it), so :func:`register` installs an ``atexit`` handler that gives the GIL up for
:data:`SETTLE_SECONDS` (``atexit`` handlers run while the interpreter is still whole: a
worker thread waiting for the GIL then gets it, and one not yet scheduled is scheduled).
It runs once per process, after ``atexit`` handlers registered later (LIFO), and only
under gloo on CPython before 3.14 (where such a thread is parked instead of ended).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time

__all__ = ["SETTLE_SECONDS", "register", "registered"]

#: Seconds the exit handler gives the GIL up for (a runnable thread's scheduling delay).
SETTLE_SECONDS = 0.2

_lock = threading.Lock()
_registered = False


def _settle() -> None:
    time.sleep(SETTLE_SECONDS)  # the GIL is free meanwhile; see the module docstring


def registered() -> bool:
    """Whether this process's exit handler is installed."""
    return _registered


def register() -> None:
    """Install the exit handler once per process (a gloo process group is in use).

    A no-op on CPython 3.14 and later, where a thread that wants the GIL during
    finalization is parked, not ended.
    """
    global _registered
    if sys.version_info >= (3, 14):
        return
    with _lock:
        if not _registered:
            atexit.register(_settle)
            _registered = True
