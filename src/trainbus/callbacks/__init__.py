"""Built-in callbacks, one per module."""

from __future__ import annotations

__all__ = ()
