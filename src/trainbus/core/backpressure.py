"""What a logger destination declares happens to its records when it falls behind.

A destination falls behind when ``queue_size`` records logged for it are not yet delivered (the
one it receives now counts): a count the user sets, never a measured time. The policy is a
value (:class:`Backpressure`), declared as the destination's ``backpressure`` attribute and
checked once, when the trainer is built (:func:`backpressure_of`). ``docs/loggers.md``,
"Falling behind", is the user's description; ``bus/mailbox.py`` carries the lossy ones out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainbus.core.renamed import warn_renamed

__all__ = ["Backpressure", "Policy", "backpressure_of"]

Policy = Literal["block", "drop_oldest", "latest", "coalesce"]


@dataclass(frozen=True, slots=True, init=False)
class Backpressure:
    """A destination's policy for when ``queue_size`` of its records wait (``docs/loggers.md``).

    Build one with :meth:`block` (the default), :meth:`drop_oldest`, :meth:`latest` or
    :meth:`coalesce`.

    Attributes:
        policy: ``"block"``, ``"drop_oldest"``, ``"latest"`` or ``"coalesce"``.
        queue_size: Records logged and not yet delivered at which the policy applies;
            ``None`` (``block`` only): the trainer's ``queue_size``. (``limit=`` is its
            old name: it still works, and warns once.)

    Example:
        >>> lines = JSONLinesLogger("runs/live.jsonl")
        >>> lines.backpressure = Backpressure.latest(queue_size=64)
        >>> trainer = Trainer(model, loader, "1ep", loggers=[lines])
    """

    policy: Policy
    queue_size: int | None

    def __init__(
        self, policy: Policy = "block", queue_size: int | None = None, *, limit: int | None = None
    ) -> None:
        if limit is not None:
            if queue_size is not None:
                raise TypeError(
                    "Backpressure() got both limit= and queue_size=; pass queue_size= only "
                    "(limit is its old name)"
                )
            warn_renamed(f"Backpressure.{policy}", "limit", "queue_size", stacklevel=_depth())
            queue_size = limit
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "queue_size", queue_size)
        self._check()

    def _check(self) -> None:
        if self.policy not in ("block", "drop_oldest", "latest", "coalesce"):
            raise ValueError(
                f"Backpressure(policy={self.policy!r}) is not a policy; use Backpressure."
                "block(), .drop_oldest(queue_size), .latest(queue_size) or "
                ".coalesce(queue_size)"
            )
        size = self.queue_size
        if size is None and self.policy == "block":
            return
        least = 1 if self.policy == "block" else 2
        if isinstance(size, bool) or not isinstance(size, int) or size < least:
            why = "" if least == 1 else " (one record being received, at least one waiting)"
            raise ValueError(
                f"Backpressure.{self.policy}(queue_size={size!r}): queue_size must be an int "
                f">= {least}{why}, a count of records, e.g. "
                f"Backpressure.{self.policy}(queue_size=64)"
            )

    @property
    def limit(self) -> int | None:
        """Deprecated name of :attr:`queue_size`."""
        return self.queue_size

    @classmethod
    def block(cls, queue_size: int | None = None, *, limit: int | None = None) -> Backpressure:
        """Whoever logs waits for room (D12); nothing is lost. ``None``: ``queue_size``."""
        return cls("block", queue_size, limit=limit)

    @classmethod
    def drop_oldest(
        cls, queue_size: int | None = None, *, limit: int | None = None
    ) -> Backpressure:
        """Queue the new record and drop the oldest waiting one."""
        return cls("drop_oldest", queue_size, limit=limit)

    @classmethod
    def latest(cls, queue_size: int | None = None, *, limit: int | None = None) -> Backpressure:
        """Per metric name the latest value wins: a new record drops each waiting record
        whose names it all carries again; if none, the oldest waiting record."""
        return cls("latest", queue_size, limit=limit)

    @classmethod
    def coalesce(cls, queue_size: int | None = None, *, limit: int | None = None) -> Backpressure:
        """Merge the new record into the newest waiting one of the same step, level and
        kind (a name's newer value wins); a record of another step waits, as with block."""
        return cls("coalesce", queue_size, limit=limit)

    @property
    def lossy(self) -> bool:
        """Whether the policy may drop records or values (every policy but ``block``)."""
        return self.policy != "block"

    def __repr__(self) -> str:
        if self.policy == "block" and self.queue_size is None:
            return "Backpressure.block()"
        return f"Backpressure.{self.policy}(queue_size={self.queue_size})"


def _depth() -> int:
    """The stack level of the user's call: above ``Backpressure.__init__`` and a
    classmethod (``Backpressure.latest(queue_size=...)``) when one called it."""
    import sys

    caller = sys._getframe(2).f_code.co_name
    return 3 if caller in ("block", "drop_oldest", "latest", "coalesce") else 2


_DEFAULT = Backpressure()


def backpressure_of(destination: Any, where: str) -> Backpressure:
    """``destination``'s declared policy (the default when it declares none), checked.

    Raises:
        TypeError: ``backpressure`` is not a :class:`Backpressure`.
        ValueError: The destination refuses lossy policies (``_refuses_lossy``: why), and
            declares one.
    """
    declared = getattr(destination, "backpressure", None)
    name = type(destination).__qualname__
    if declared is None:
        return _DEFAULT
    if not isinstance(declared, Backpressure):
        raise TypeError(
            f"{where}: {name}.backpressure = {declared!r} is not a trainbus.Backpressure; "
            "use e.g. Backpressure.drop_oldest(queue_size=64) (docs/loggers.md, 'Falling behind')"
        )
    refuses = getattr(destination, "_refuses_lossy", None)
    if declared.lossy and refuses:
        raise ValueError(
            f"{where}: {name} takes only Backpressure.block(...), not {declared!r}: "
            f"{refuses}. Remove the backpressure attribute, or log to another destination "
            "for a lossy view (docs/loggers.md, 'Falling behind')"
        )
    return declared


# Shown as ``trainbus.X`` in tracebacks and reprs (it is exported there; pickling works).
Backpressure.__module__ = "trainbus"
