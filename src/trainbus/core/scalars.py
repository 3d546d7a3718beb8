"""Logged values: copies that a destination may queue, and GPU scalars without a sync.

A CUDA tensor handed to the logger is not read with ``.item()`` (a host-device sync):
its host copy is started with ``non_blocking=True`` into pinned memory and a CUDA event
is recorded behind it. The value is resolved later, off the training thread, by
whoever needs it: :meth:`DeferredScalar.ready` tells whether resolving would wait, so
an event-loop lane can move the wait to a worker thread (guarantee D14).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["DeferredScalar", "copy_value", "resolve_value"]

_HOST_COPY_ATTR = "_trainbus_host_copy"


class DeferredScalar:
    """A scalar tensor's value, copied to the host without blocking the caller."""

    __slots__ = ("_event", "_host", "_value")

    def __init__(self, tensor: torch.Tensor) -> None:
        self._value: float | None = None
        self._event: Any = None
        t = tensor.detach()
        if t.device.type == "cuda":
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._host: torch.Tensor | None = host
            self._event = event
        else:
            self._host = None
            self._value = float(t.reshape(()).item()) if t.numel() == 1 else float("nan")

    @classmethod
    def of(cls, tensor: torch.Tensor) -> DeferredScalar:
        """The deferred value of ``tensor``, reusing a copy the trainer already started."""
        started = getattr(tensor, _HOST_COPY_ATTR, None)
        if isinstance(started, DeferredScalar):
            return started
        return cls(tensor)

    @classmethod
    def start(cls, tensor: torch.Tensor) -> torch.Tensor:
        """Start the host copy now (on the calling, training thread) and tag the tensor.

        Returns the tensor, so a loss can be tagged in place:
        ``loss = DeferredScalar.start(loss)``. CPU tensors are left untouched.
        """
        if tensor.device.type == "cuda" and tensor.numel() == 1:
            setattr(tensor, _HOST_COPY_ATTR, cls(tensor))
        return tensor

    def ready(self) -> bool:
        """Whether :meth:`get` would return without waiting for the device."""
        event = self._event
        return self._value is not None or event is None or bool(event.query())

    def get(self) -> float:
        """The value; waits for the device copy if it has not finished.

        Safe from several threads at once (two destinations resolving one record): each
        works on its own references, and ``_value`` is set before the copy is let go, so
        a caller that finds the copy gone finds the value.
        """
        value = self._value
        if value is None:
            event, host = self._event, self._host
            if event is None or host is None:  # another thread resolved it meanwhile
                value = self._value
                assert value is not None
                return value
            event.synchronize()
            value = float(host.reshape(()).item())
            self._value = value
            self._host = None
            self._event = None
        return value

    def __float__(self) -> float:
        return self.get()

    def __repr__(self) -> str:
        return f"DeferredScalar({self._value if self._value is not None else '...'})"


def copy_value(value: Any) -> Any:
    """A copy of a logged value that stays valid while queued.

    Numbers and strings pass through; one-element tensors become a
    :class:`DeferredScalar`; other tensors are detached CPU copies; anything else is
    deep-copied.
    """
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() == 1:
            return DeferredScalar.of(value)
        return value.detach().to("cpu", copy=True)
    if isinstance(value, numbers.Real):  # numpy scalars and friends
        return float(value)
    return copy.deepcopy(value)


def resolve_value(value: Any) -> Any:
    """Replace a :class:`DeferredScalar` by its float; other values pass through."""
    if isinstance(value, DeferredScalar):
        return value.get()
    return value


def all_ready(values: Mapping[str, Any]) -> bool:
    """Whether resolving every value in ``values`` would return without waiting."""
    return all(v.ready() for v in values.values() if isinstance(v, DeferredScalar))
