"""The uploader's write-ahead journal: recovery with original keys, replayed points dropped.

The end-to-end guarantee (SIGKILL, resume, exactly once at a real server) is tested with
real processes in ``tests/test_crash_consistency.py``; these tests pin down each rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_trainer
from tests.loggers.test_http_uploader import (
    FAST,
    LogExtras,
    MetricsServer,
    Reply,
    Request,
    servers,
)
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import HTTPMetricsUploader
from trainbus.loggers._journal import JOURNAL_NAME, Journal
from trainbus.loggers._spool import Batch

__all__ = ["servers"]  # the fixture, re-exported for pytest


def point(name: str, step: int, value: float = 1.0) -> dict[str, Any]:
    return {"name": name, "value": value, "step": step, "wall_time": 0.5}


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / JOURNAL_NAME).read_text().splitlines()]


def test_points_are_in_the_file_when_admit_returns(tmp_path: Path) -> None:
    journal = Journal(tmp_path, batch_size=10)
    assert journal.admit([point("a", 1), point("b", 1)]) == [point("a", 1), point("b", 1)]
    lines = records(tmp_path)
    assert lines[0]["format"] == 1
    assert lines[1:] == [{"i": 0, **point("a", 1)}, {"i": 1, **point("b", 1)}]


def test_a_restarted_journal_resends_unacknowledged_batches_with_their_keys(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, batch_size=2)
    journal.admit([point("a", s) for s in range(5)])
    first, second = (Batch(key=k, points=[], run="r") for k in ("key-1", "key-2"))
    first.points, second.points = [point("a", 0), point("a", 1)], [point("a", 2), point("a", 3)]
    journal.write(first)
    journal.write(second)
    journal.remove(first)  # acknowledged
    # killed here: "a"@4 was logged but never sealed

    batches, corrupt = Journal(tmp_path, batch_size=2).load()
    assert corrupt == []
    assert len(batches) == 2 and batches[0].key == "key-2"
    assert batches[0].points == second.points and batches[0].run == "r"
    assert batches[1].points == [point("a", 4)] and batches[1].run is None
    # The new key of the never-sealed point was recorded first: a second restart reuses it.
    again, _ = Journal(tmp_path, batch_size=2).load()
    assert [b.key for b in again] == [b.key for b in batches]


def test_points_journaled_after_the_checkpoint_are_dropped_once_when_replayed(
    tmp_path: Path,
) -> None:
    killed = Journal(tmp_path, batch_size=10)
    killed.admit([point("loss", 1), point("loss", 2)])
    at_checkpoint = killed.state_dict()
    killed.admit([point("loss", 3), point("eval", 3), point("loss", 4)])

    resumed = Journal(tmp_path, batch_size=10)
    resumed.load_state_dict(at_checkpoint)
    assert resumed.admit([point("loss", 3), point("eval", 3)]) == []
    second_checkpoint = resumed.state_dict()  # "loss"@4 not replayed yet: carried over
    assert second_checkpoint["pending"] == [["loss", 4]]
    assert resumed.admit([point("loss", 4), point("loss", 5)]) == [point("loss", 5)]
    assert resumed.admit([point("loss", 4)]) == [point("loss", 4)]  # once per occurrence

    again = Journal(tmp_path, batch_size=10)
    again.load_state_dict(second_checkpoint)
    assert again.admit([point("loss", 4), point("loss", 5)]) == []


def test_a_checkpoint_of_another_journal_drops_only_its_pending_points(tmp_path: Path) -> None:
    journal = Journal(tmp_path, batch_size=10)
    journal.admit([point("loss", 1)])
    journal.load_state_dict({"journal": "another", "position": 0, "pending": [["loss", 2]]})
    assert journal.admit([point("loss", 1), point("loss", 2)]) == [point("loss", 1)]


def test_a_torn_last_line_is_cut_and_a_broken_journal_set_aside(tmp_path: Path) -> None:
    journal = Journal(tmp_path, batch_size=10)
    journal.admit([point("a", 1)])
    with open(tmp_path / JOURNAL_NAME, "a") as f:
        f.write('{"i": 1, "name": "a", "va')  # a power loss in the middle of a write
    batches, _ = Journal(tmp_path, batch_size=10).load()
    assert [b.points for b in batches] == [[point("a", 1)]]
    assert (tmp_path / JOURNAL_NAME).read_text().endswith("\n")

    (tmp_path / JOURNAL_NAME).write_text("not json\n")
    broken = Journal(tmp_path, batch_size=10)
    assert broken.load()[0] == []
    assert broken.corrupt is not None
    assert broken.corrupt[0].name.startswith(f"{JOURNAL_NAME}.corrupt-")


def test_journal_needs_a_spool_dir() -> None:
    with pytest.raises(ValueError, match="journal=True needs a spool_dir"):
        HTTPMetricsUploader("http://127.0.0.1:1/m", journal=True)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_completed_run_delivers_everything_once_and_deletes_its_journal(
    anyio_backend: str, servers: Callable[..., MetricsServer], tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    sealed_first: dict[str, bool] = {}

    def read_journal(n: int, request: Request) -> Reply:  # the key is on disk already?
        sealed_first[request.key] = f'"seal":"{request.key}"' in (spool / JOURNAL_NAME).read_text()
        return Reply()

    server = servers(read_journal)
    uploader = HTTPMetricsUploader(server.url, batch_size=4, spool_dir=spool, journal=True, **FAST)
    saver = CheckpointSaver(tmp_path / "ckpt", save_interval="3ba")
    trainer = make_trainer(10, callbacks=[saver, LogExtras()], loggers=[uploader])  # fmt: skip
    await trainer.fit()
    assert set(server.points().values()) == {1}
    assert len(server.points()) == 30  # loss/train, a and b for 10 batches
    assert sealed_first and all(sealed_first.values())
    assert not (spool / JOURNAL_NAME).exists()  # delivered and complete: retired
    assert uploader.statistics().points_sent == 30


def test_a_journal_planted_as_a_symlink_is_never_written_through(tmp_path: Path) -> None:
    """Issue 46: a symbolic link under the journal's name gets nothing appended or cut."""
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"the user's text, no newline at the end")
    missing = tmp_path / "created.txt"
    for target in (precious, missing):
        spool = tmp_path / f"spool-{target.stem}"
        spool.mkdir()
        (spool / JOURNAL_NAME).symlink_to(target)
        journal = Journal(spool, batch_size=10)
        try:
            journal.open()  # a link to a file that is no journal: set aside, a fresh one made
            journal.admit([point("loss", 1)])
        except OSError:
            pass  # a dangling link: refused
        finally:
            journal.close()
    assert precious.read_bytes() == b"the user's text, no newline at the end"
    assert not missing.exists()
