"""A saver's checkpoints later than where its run starts: the abandoned future, moved aside.

A run that restarts from an older checkpoint than the newest in its saver's folder (Ray
restarts from its last *registered* checkpoint, a user passes an older ``load_path``, a
restart finds no checkpoint at all) would save again under names that folder already holds.
Those files are the future of an attempt that was abandoned: the restarted run rewrites it.

The rule (``docs/checkpoints.md``, "Restarting from an older checkpoint"): when ``fit()``
starts at timestamp ``T`` (batch 0 for a fresh run), every checkpoint in the saver's folder
whose name the saver's ``filename`` gives at a later timestamp than ``T`` is moved, with its
path relative to the folder, into ``<folder>/abandoned/after-ba<T.batch>/`` (``-2``, ``-3``,
... when that exists). Nothing is deleted. "Later" compares the first of ``{batch}``,
``{sample}``, ``{token}``, ``{epoch}`` the filename has; a filename with none of them (a fixed
name such as ``latest.pt``) orders nothing and moves nothing. Symbolic links stay where they
are. :func:`later_checkpoints` finds them, :func:`move_aside` moves them.
"""

from __future__ import annotations

import os
import pathlib
import re
import stat
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainbus.core.timer import Timestamp

__all__ = ["ABANDONED", "later_checkpoints", "move_aside", "name_pattern"]

#: The subfolder of a saver's folder that abandoned checkpoints are moved into.
ABANDONED = "abandoned"
#: The counters that order a saver's names, most precise first (``batch_in_epoch`` restarts
#: each epoch, ``rank`` is no time).
_ORDER = ("batch", "sample", "token", "epoch")


def name_pattern(filename: str) -> re.Pattern[str]:
    """A pattern that the names ``filename`` gives fully match, one group per field.

    Each replacement field (``{batch}``, ``{epoch:03d}``, ...) matches an integer, captured
    under its name (a field used twice must hold the same value); the rest matches literally.

    Example:
        >>> name_pattern("ep{epoch}-ba{batch}.pt").fullmatch("ep1-ba8.pt").group("batch")
        '8'
    """
    pieces, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(filename):
        pieces.append(re.escape(literal))
        if field is None:
            continue
        if field in seen:
            pieces.append(f"(?P={field})")
        else:
            seen.add(field)
            pieces.append(rf"(?P<{field}>[-+]?\d+)")
    return re.compile("".join(pieces))


def _is_later(match: re.Match[str], start: Timestamp) -> bool:
    counters = start.state_dict()
    for field in _ORDER:
        value = match.groupdict().get(field)
        if value is not None:
            return int(value) > counters[field]
    return False


def later_checkpoints(
    folder: pathlib.Path, filenames: tuple[str, ...], start: Timestamp
) -> list[pathlib.Path]:
    """The entries of ``folder`` named by one of ``filenames`` at a later timestamp than ``start``.

    ``filenames`` are the saver's name templates (a file's, and a sharded checkpoint's
    folder's); they may hold ``/``. Subfolders are entered only as deep as the templates
    go, never through a link and never into :data:`ABANDONED`; links are not returned.
    """
    patterns = [name_pattern(f) for f in filenames]
    depth = max(f.count("/") for f in filenames)
    found: list[pathlib.Path] = []

    def walk(where: pathlib.Path, relative: str, level: int) -> None:
        try:
            entries = sorted(os.scandir(where), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if level == 0 and entry.name == ABANDONED:
                continue
            name = f"{relative}{entry.name}"
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            if any((m := p.fullmatch(name)) and _is_later(m, start) for p in patterns):
                found.append(where / entry.name)
            elif stat.S_ISDIR(mode) and level < depth:
                walk(where / entry.name, name + "/", level + 1)

    walk(folder, "", 0)
    return found


def move_aside(folder: pathlib.Path, paths: list[pathlib.Path], start: Timestamp) -> pathlib.Path:
    """Move ``paths`` (in ``folder``) into a new ``abandoned/after-ba<batch>`` subfolder.

    Each keeps its path relative to ``folder``. Returns the subfolder.
    """
    base = folder / ABANDONED / f"after-ba{int(start.batch)}"
    target, n = base, 1
    while target.exists() or target.is_symlink():
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    for path in paths:
        moved = target / path.relative_to(folder)
        moved.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, moved)  # one file system: nothing is copied, nothing half there
    return target
