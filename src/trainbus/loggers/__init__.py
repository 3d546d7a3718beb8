"""Built-in logger destinations, one per module; heavy dependencies load lazily."""

from __future__ import annotations

from trainbus.loggers.in_memory import InMemoryLogger as InMemoryLogger

__all__ = ("InMemoryLogger",)
