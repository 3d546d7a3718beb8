"""What a TensorBoard log folder already holds: ``(tag, step)`` of its events after a position.

A resumed :class:`~trainbus.loggers.TensorBoardLogger` drops the values the killed run
already wrote (``docs/crash-consistency.md``, "The replay rule"). Its checkpoint records the
length of every event file in the folder; the events after those lengths (and every event of
a file created after the checkpoint) are the killed run's points after the checkpoint.

Event files are TFRecord files: each record is an 8-byte little-endian length, a 4-byte
CRC of it, the data (one serialized ``tensorboard`` ``Event``) and a 4-byte CRC of the data.
A record cut short (a process killed during a write) ends the reading: TensorBoard's own
reader stops there too.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path

__all__ = ["event_files", "events_after"]

_HEADER = struct.Struct("<QI")
_TEXT_SUFFIX = "/text_summary"


def event_files(log_dir: Path) -> dict[str, int]:
    """The event files of ``log_dir`` (by name) and their lengths now."""
    try:
        entries = list(os.scandir(log_dir))
    except FileNotFoundError:
        return {}
    return {
        e.name: e.stat().st_size
        for e in entries
        if "tfevents" in e.name and e.is_file(follow_symlinks=False)
    }


def _records(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos + _HEADER.size <= len(data):
        (length, _crc) = _HEADER.unpack_from(data, pos)
        start = pos + _HEADER.size
        end = start + length + 4
        if end > len(data):
            break  # a torn last record
        out.append(data[start : start + length])
        pos = end
    return out


def events_after(log_dir: Path, positions: dict[str, int]) -> Counter[tuple[str, int]]:
    """``(tag, step)`` of each summary value written after ``positions`` (a file not in
    ``positions`` is read whole). A text value's tag is its name (without the
    ``/text_summary`` TensorBoard adds)."""
    from tensorboard.compat.proto.event_pb2 import Event

    keys: Counter[tuple[str, int]] = Counter()
    for name in sorted(event_files(log_dir)):
        with open(log_dir / name, "rb") as f:
            f.seek(positions.get(name, 0))
            data = f.read()
        for raw in _records(data):
            event = Event()
            try:
                event.ParseFromString(raw)
            except Exception:  # a damaged record: TensorBoard skips it as well
                continue
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                tag = value.tag
                if tag.endswith(_TEXT_SUFFIX):
                    tag = tag[: -len(_TEXT_SUFFIX)]
                keys[(tag, int(event.step))] += 1
    return keys
