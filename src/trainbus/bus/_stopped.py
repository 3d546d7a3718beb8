"""The producer's unwinding signal, shared by the bus's two halves."""

from __future__ import annotations

__all__ = ["Stopped"]


class Stopped(Exception):
    """Raised on the producer thread when the bus stops (an error, a cancellation)."""
