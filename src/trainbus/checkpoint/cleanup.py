"""What a saver deletes in its own folder: pruned checkpoints and stale temporary files.

Only what a save wrote is deleted, and never through a symbolic link (the folder is the
run's, and whoever can write into it must not be able to steer a deletion elsewhere):

- :func:`remove_checkpoint` deletes a pruned (or overwritten) checkpoint: a regular file,
  or a sharded checkpoint's folder (its ``.metadata`` first, then its regular files, then
  the folder once empty). A link or anything else now under the checkpoint's name is left
  alone; no subfolder of a sharded folder is entered.
- :func:`remove_stale_partials` deletes the hidden ``.<name>.partial-<8 hex>`` files of
  :func:`~trainbus.checkpoint.format.write_atomic` that a killed process left, in the
  saver's folder and in the subfolders its ``filename`` makes (:func:`template_folders`),
  no other.

Every folder is opened with ``O_NOFOLLOW`` and its entries deleted relative to that open
folder (``dir_fd``), so a folder swapped for a link between a check and a deletion is
refused, not followed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import stat
import string
from collections.abc import Sequence

from trainbus.checkpoint.format import TEMP_MARKER
from trainbus.checkpoint.sharded import METADATA

__all__ = ["remove_checkpoint", "remove_stale_partials", "template_folders"]

_PARTIAL = re.compile(rf"^\..+\.{TEMP_MARKER}[0-9a-f]{{8}}$")
_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def remove_checkpoint(path: pathlib.Path, *, rank: int = 0) -> None:
    """Delete a checkpoint: a regular file, or (``rank`` zero only) a sharded folder.

    The ``.metadata`` goes first, so a folder half deleted by a crash is never taken for
    a complete checkpoint; then the folder's regular files, then the folder if it is empty
    (anything else in it, a subfolder or a link, stays, and so does the folder). A symbolic
    link under ``path`` is left alone, whatever it points to.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        path.unlink(missing_ok=True)  # unlink never follows a link (one swapped in meanwhile)
        return
    if not stat.S_ISDIR(mode) or rank != 0:
        return  # every rank wrote into this one (shared) folder; rank zero removes it
    try:  # a folder swapped for a link since the lstat is refused here (ELOOP)
        fd = os.open(path, _DIR_NOFOLLOW)
    except OSError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(METADATA, dir_fd=fd)
        for entry in list(os.scandir(fd)):
            if entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # not empty, or swapped for a link: it stays
        os.rmdir(path)


def remove_stale_partials(
    folder: pathlib.Path, before_ns: int, subfolders: Sequence[re.Pattern[str]] = ()
) -> list[pathlib.Path]:
    """Delete the temporary files of ``write_atomic`` that a killed process left behind.

    Looks in ``folder`` and in the subfolders whose names match ``subfolders``, one pattern
    per level (:func:`template_folders`); no other subfolder is entered, and none through a
    link. Deletes the regular files named as ours (``.<name>.partial-<8 hex digits>``)
    last modified before ``before_ns`` (``time.time_ns()``), nothing else. Returns those
    deleted.
    """
    removed: list[pathlib.Path] = []
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return removed
    _sweep(fd, folder, before_ns, tuple(subfolders), removed)
    return removed


def _sweep(
    fd: int,
    where: pathlib.Path,
    before_ns: int,
    levels: tuple[re.Pattern[str], ...],
    removed: list[pathlib.Path],
) -> None:
    """:func:`remove_stale_partials` in the folder open as ``fd`` (closed on return)."""
    try:
        try:
            entries = list(os.scandir(fd))
        except OSError:
            return
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    if _PARTIAL.match(entry.name) and (
                        entry.stat(follow_symlinks=False).st_mtime_ns < before_ns
                    ):
                        os.unlink(entry.name, dir_fd=fd)
                        removed.append(where / entry.name)
                elif (
                    levels
                    and levels[0].fullmatch(entry.name)
                    and entry.is_dir(follow_symlinks=False)
                ):
                    sub = os.open(entry.name, _DIR_NOFOLLOW, dir_fd=fd)
                    _sweep(sub, where / entry.name, before_ns, levels[1:], removed)
            except OSError:  # gone already, swapped for a link, or not ours to delete
                continue
    finally:
        os.close(fd)


def template_folders(filename: str) -> tuple[re.Pattern[str], ...]:
    """One pattern per folder level of a saver's ``filename`` (``/``-separated).

    Each replacement field (``{epoch}``, ``{batch:04d}``, ...) matches an integer, the rest
    matches literally: ``"rank{rank}/e{epoch}/b{batch}.pt"`` gives patterns for names like
    ``rank0`` and ``e12``, and a user's ``notes`` matches neither.

    Example:
        >>> [p.pattern for p in template_folders("e{epoch}/b{batch}.pt")]
        ['e[-+]?\\\\d+']
    """
    levels = []
    for part in filename.split("/")[:-1]:
        pieces = []
        for literal, field_name, _, _ in string.Formatter().parse(part):
            pieces.append(re.escape(literal))
            if field_name is not None:
                pieces.append(r"[-+]?\d+")
        levels.append(re.compile("".join(pieces)))
    return tuple(levels)
