"""The fault suite's parts: what is injected (an error, a ``BaseException`` or a
cancellation), where (a handler of any kind at any event, the model, the loss, the
dataloader, ``close``, ``post_close``), and the run it is injected into."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from tests.failures._harness import CloseOrder, closing
from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Event, blocking

__all__ = [
    "EPOCHS",
    "FAULTS",
    "Abort",
    "Boom",
    "TARGET",
    "FaultyLoader",
    "FaultyModel",
    "Injector",
    "faulty_callback",
    "sources",

]

FAULTS = ("exception", "system-exit", "base-exception", "cancel")
EPOCHS = 2  # x 2 batches, one eval batch after each epoch: every event but three repeats

#: The occurrence of each event the fault is injected at: the second where there is one,
#: so that a batch's points were logged before the fault.
TARGET = {e: 1 if e in (Event.INIT, Event.FIT_START, Event.FIT_END) else 2 for e in Event}


class Boom(Exception):
    """The injected ``Exception``."""


class Abort(BaseException):
    """The injected custom ``BaseException``."""


@dataclass
class Injector:
    """Fires one fault; a cancellation cancels the scope around ``fit()`` from any thread."""

    fault: str
    error: BaseException | None = None
    fired: bool = False
    scope: anyio.CancelScope | None = None
    portal: Any = None
    loop_ident: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.error = {
            "exception": Boom("injected"),
            "system-exit": SystemExit(7),
            "base-exception": Abort("injected"),
            "cancel": None,
        }[self.fault]

    def fire(self) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
        if self.error is not None:
            raise self.error
        assert self.scope is not None and self.portal is not None
        if threading.get_ident() == self.loop_ident:
            self.scope.cancel()
        else:
            self.portal.call(self.scope.cancel)


def faulty_callback(kind: str, where: str, injector: Injector, order: CloseOrder) -> Callback:
    """A ``Faulty`` callback: ``kind`` "sync", "async" or "blocking" (its handler, and
    close/post_close: async for "async", plain otherwise); ``where`` an event's value,
    "close" or "post_close" (else it only records its close calls)."""
    close_kind = "async" if kind == "async" else "sync"
    base = closing(close_kind, "Faulty", order)
    attrs: dict[str, Any] = {}
    if where in Event._value2member_map_:
        target = TARGET[Event(where)]
        seen = [0]

        if kind == "async":

            async def ahandler(self: Any, state: Any, logger: Any) -> None:
                seen[0] += 1
                if seen[0] == target:
                    injector.fire()

            attrs[where] = ahandler
        else:

            def handler(self: Any, state: Any, logger: Any) -> None:
                seen[0] += 1
                if seen[0] == target:
                    injector.fire()

            attrs[where] = blocking(handler) if kind == "blocking" else handler
    elif where in ("close", "post_close"):
        record = getattr(base, where)
        if close_kind == "async":

            async def afire(self: Any, *args: Any) -> None:
                await record(self, *args)
                injector.fire()

            attrs[where] = afire
        else:

            def fire(self: Any, *args: Any) -> None:
                record(self, *args)
                injector.fire()

            attrs[where] = fire
    made: Callback = type("Faulty", (base,), attrs)()
    return made


class FaultyModel(TinyModel):
    """Fires in its second training ``forward`` (``where="forward"``) or ``loss``."""

    def __init__(self, where: str, injector: Injector) -> None:
        super().__init__()
        self.where, self.injector = where, injector
        self.losses = 0

    def forward(self, batch: Any) -> torch.Tensor:
        out = super().forward(batch)
        if self.where == "forward" and self.training and self.training_forwards == 2:
            self.injector.fire()
        return out

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        self.losses += 1
        if self.where == "loss" and self.losses == 2:
            self.injector.fire()
        return super().loss(outputs, batch)


class FaultyLoader:
    """Two batches per epoch; fires when the second batch of the first epoch is drawn."""

    def __init__(self, injector: Injector | None) -> None:
        self.base = make_loader(2)
        self.injector = injector
        self.drawn = 0

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.base:
            self.drawn += 1
            if self.injector is not None and self.drawn == 2:
                self.injector.fire()
            yield batch


def sources() -> list[tuple[str, str]]:
    """Every (kind, where) a fault can come from."""
    found = [(kind, e.value) for kind in ("sync", "async", "blocking") for e in Event]
    found += [("model", "forward"), ("model", "loss"), ("model", "dataloader")]
    found += [(kind, where) for kind in ("sync", "async") for where in ("close", "post_close")]
    return found

