"""``DeferredScalar``: a device scalar's host copy, resolved by whichever destination needs
it first. On CUDA two destinations' threads resolve one record at once (seen on an H200:
``AssertionError`` in ``get``, raised by ``ProgressBar`` and ``InMemoryLogger`` together).

The CUDA copy is stood in for by an event object: the interleaving is what is tested, and
it is forced deterministically (the other thread finishes while this one waits)."""

from __future__ import annotations

import torch

from trainbus.core.scalars import DeferredScalar


class Event:
    """A CUDA event's two methods; its ``synchronize`` lets another caller finish first."""

    def __init__(self, scalar: DeferredScalar | None = None) -> None:
        self.scalar = scalar

    def synchronize(self) -> None:
        other, self.scalar = self.scalar, None
        if other is not None:
            assert other.get() == 2.5  # the other destination resolves it meanwhile

    def query(self) -> bool:
        return False


def pending(value: float) -> DeferredScalar:
    scalar = DeferredScalar.__new__(DeferredScalar)
    scalar._value = None
    scalar._host = torch.tensor(value)
    scalar._event = Event(scalar)
    return scalar


def test_two_callers_resolve_one_scalar_at_once() -> None:
    scalar = pending(2.5)
    assert scalar.get() == 2.5  # before: AssertionError (the copy was let go meanwhile)
    assert scalar.get() == 2.5


def test_ready_after_another_caller_resolved_it() -> None:
    scalar = pending(1.0)
    assert not scalar.ready()
    scalar._event = Event()
    scalar.get()
    assert scalar.ready()


def test_a_cpu_scalar_is_resolved_at_once() -> None:
    scalar = DeferredScalar(torch.tensor(3.0))
    assert scalar.ready() and scalar.get() == 3.0
