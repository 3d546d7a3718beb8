"""Options renamed by the naming rule (``CONTRIBUTING.md``, "Naming options"): the old
name still works, and warns once per process with a ``DeprecationWarning`` naming the new.

Example:
    >>> def __init__(self, *, flush_seconds: float = 1.0, flush_interval: float | None = None):
    ...     flush_seconds = renamed_option(
    ...         "JSONLinesLogger", "flush_interval", flush_interval, "flush_seconds",
    ...         flush_seconds, default=1.0,
    ...     )
"""

from __future__ import annotations

import warnings
from typing import TypeVar

__all__ = ["renamed_option", "warn_renamed"]

T = TypeVar("T")

#: ``(owner, old name)`` pairs already warned about in this process.
_WARNED: set[tuple[str, str]] = set()


def warn_renamed(owner: str, old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn (once per process for ``owner``'s ``old``) that ``old`` is now ``new``."""
    if (owner, old) in _WARNED:
        return
    _WARNED.add((owner, old))
    warnings.warn(
        f"{owner}({old}=...) is deprecated: the option is now {new}= (the same meaning; "
        "see CONTRIBUTING.md, 'Naming options'); the old name still works",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def renamed_option(
    owner: str,
    old: str,
    old_value: T | None,
    new: str,
    new_value: T,
    *,
    default: T,
    stacklevel: int = 3,
) -> T:
    """The option's value: ``new_value``, or ``old_value`` (warning once) when only the
    old name was given. ``None`` for ``old_value`` means "not given".

    Raises:
        TypeError: Both names were given.
    """
    if old_value is None:
        return new_value
    if new_value != default:
        raise TypeError(
            f"{owner}() got both {old}= and {new}=; pass {new}= only ({old} is its old name)"
        )
    warn_renamed(owner, old, new, stacklevel=stacklevel)
    return old_value
