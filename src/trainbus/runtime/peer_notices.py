"""A preemption notice sent to every other rank at once, out of band (``torchrun``, Ray).

``runtime/distributed.py``'s stop agreement carries a notice from rank to rank at batch
boundaries; this carries it at once, through the process group's key-value store, to a rank
whose training thread cannot reach a boundary (``docs/preemption.md``, "Every rank
together").
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from trainbus.runtime.distributed import DistInfo

__all__ = ["PeerNotices"]


#: The store's keys of :class:`PeerNotices` (under the process group's own prefix).
_NOTICE_KEYS = "trainbus/preemption"


class PeerNotices:
    """A preemption notice sent to every other rank at once, out of band (any thread).

    The stop agreement carries a notice at batch boundaries; a rank whose training thread
    waits at a barrier for a stuck handler (or in a collective for a peer that does) never
    reaches one, so it would never learn of a notice given elsewhere, and its own watchdog
    would never start. Here each rank keeps one thread (``trainbus-peer-notices``) blocked
    on its own key of the process group's key-value store (its own connection, so the
    store's other users never wait for it): :meth:`send` writes the notice (signal number,
    seconds left) to every other rank's key, and that rank's thread gives it
    (``on_notice(signum, seconds_left)``) at once, whatever its training thread does.
    :meth:`close` ends this rank's thread (the fit's end). Created on every rank at the
    start of each ``fit()`` (:meth:`create`: no collective; each rank counts the fit with
    one ``add`` on the store, so the keys of one fit never meet another's).

    Example:
        >>> peers = PeerNotices.create(info, lambda signum, left: ...)  # every rank
        >>> peers.send(signal.SIGTERM, 7.5)   # a notice here: every other rank gets it
        >>> peers.close()
    """

    def __init__(self, store: Any, sender: Any, prefix: str, rank: int, world_size: int) -> None:
        self._store = store  # this rank's thread waits on it (a wait holds its connection)
        self._sender = sender
        self._prefix = prefix
        self._rank = rank
        self._world = world_size
        self._sent = False
        self._thread: threading.Thread | None = None

    @classmethod
    def create(cls, info: DistInfo, on_notice: Callable[[int, float], None]) -> PeerNotices | None:
        """This rank's channel for one ``fit()`` (every rank), or ``None`` outside a
        distributed run or when the process group has no store to share."""
        if not info.distributed or not (dist.is_available() and dist.is_initialized()):
            return None
        try:
            default = dist.distributed_c10d._get_default_store()
            store, sender = default.clone(), default.clone()  # type: ignore[attr-defined]
            fit = (int(sender.add(f"{_NOTICE_KEYS}/fits", 1)) - 1) // info.world_size
        except Exception:  # a group without a store to share: the agreement alone
            return None
        peers = cls(store, sender, f"{_NOTICE_KEYS}/{fit}", info.rank, info.world_size)
        thread = threading.Thread(
            target=peers._listen, args=(on_notice,), name="trainbus-peer-notices",
            daemon=True,
        )  # fmt: skip
        thread.start()
        peers._thread = thread
        return peers

    def _key(self, rank: int) -> str:
        return f"{self._prefix}/{rank}"

    def send(self, signum: int, seconds_left: float) -> None:
        """Give every other rank this notice (once; later calls do nothing)."""
        if self._sent:
            return
        self._sent = True
        value = f"{int(signum)} {max(0.0, float(seconds_left)):.3f}"
        for rank in range(self._world):
            if rank != self._rank:
                with contextlib.suppress(Exception):  # the store is gone: the job ends
                    self._sender.set(self._key(rank), value)

    def _listen(self, on_notice: Callable[[int, float], None]) -> None:
        key = self._key(self._rank)
        try:
            while True:
                try:
                    self._store.wait([key], datetime.timedelta(hours=1))
                    break
                except Exception as exc:  # not there yet after an hour: wait again
                    if "timeout" not in str(exc).lower() or self._closed():
                        return
            value = self._store.get(key).decode()
        except Exception:  # the store went away (the job ends): no notice comes
            return
        if value == "end":
            return
        signum, _, left = value.partition(" ")
        with contextlib.suppress(ValueError):
            on_notice(int(signum), float(left))

    def _closed(self) -> bool:
        return self._thread is None

    def close(self) -> None:
        """End this rank's listening thread (the fit's end; training thread)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(Exception):  # the store went away: the thread ends by itself
            self._sender.compare_set(self._key(self._rank), "", "end")
        thread.join(5.0)
