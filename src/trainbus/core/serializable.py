"""The ``state_dict`` protocol shared by callbacks, the timer and the state."""

from __future__ import annotations

from typing import Any

__all__ = ["Serializable"]


class Serializable:
    """An object whose state can be saved to and restored from a checkpoint.

    Subclasses override :meth:`state_dict` and :meth:`load_state_dict`; the defaults
    save nothing. Values must be picklable by ``torch.save``.

    Example:
        >>> class Counter(Serializable):
        ...     def __init__(self):
        ...         self.n = 0
        ...     def state_dict(self):
        ...         return {"n": self.n}
        ...     def load_state_dict(self, state):
        ...         self.n = state["n"]
    """

    def state_dict(self) -> dict[str, Any]:
        """Return the object's state as a picklable dictionary."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""
