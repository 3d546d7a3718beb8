"""CheckpointSaver: where and when it writes, atomicity, pruning, errors, callback state."""

from __future__ import annotations

import collections
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, CheckpointWarning, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.checkpoint.format import safe_globals
from trainbus.checkpoint.resume import find_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]


def load(path: pathlib.Path) -> dict[str, Any]:
    with safe_globals():
        obj: dict[str, Any] = torch.load(path, weights_only=True)
    return obj


def fit(callbacks: list[Callback], n_batches: int = 3, epochs: int = 2, **kw: Any) -> Trainer:
    trainer = Trainer(
        TinyModel(), make_loader(n_batches), f"{epochs}ep", callbacks=callbacks,
        device="cpu", **kw,
    )  # fmt: skip
    trainer.fit_sync()
    return trainer


class Counter(Callback):
    """Counts epochs in a cheap plain handler (queued, run late by default)."""

    def __init__(self, start: int = 0) -> None:
        self.epochs = start
        self.seen: collections.deque[int] = collections.deque(maxlen=4)

    def epoch_end(self, state: Any, logger: Any) -> None:
        self.epochs += 1
        self.seen.append(int(state.timer.epoch))

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs = state["epochs"]
        self.seen = state["seen"]


def test_saves_at_each_epoch_with_formatted_names(
    tmp_path: pathlib.Path, no_leaked_threads: None
) -> None:
    saver = CheckpointSaver(tmp_path)
    fit([saver])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ep1-ba3-rank0.pt", "ep2-ba6-rank0.pt"]
    assert [(int(ts.epoch), int(ts.batch)) for ts, _ in saver.saved_checkpoints] == [(1, 3), (2, 6)]
    assert [paths for _, paths in saver.saved_checkpoints] == [
        [tmp_path / "ep1-ba3-rank0.pt"],
        [tmp_path / "ep2-ba6-rank0.pt"],
    ]
    stats = saver.statistics()
    assert stats.saves == stats.written == 2  # close waited for the last write
    ckpt = load(tmp_path / "ep2-ba6-rank0.pt")
    assert ckpt["timer"]["batch"] == 6
    assert set(ckpt) >= {"model", "optimizers", "schedulers", "scaler", "rng", "callbacks"}
    assert set(ckpt["rng"]) >= {"python", "numpy", "torch"}


def test_callback_state_is_taken_after_every_earlier_handler(tmp_path: pathlib.Path) -> None:
    counter = Counter()
    fit([counter, CheckpointSaver(tmp_path)])
    states = load(tmp_path / "ep1-ba3-rank0.pt")["callbacks"]
    key = f"{Counter.__module__}.Counter#0"
    assert states[key]["epochs"] == 1  # its EPOCH_END handler ran before the capture
    assert list(states[key]["seen"]) == [1]


def test_two_instances_of_one_class_do_not_collide(tmp_path: pathlib.Path) -> None:
    first, second = Counter(start=0), Counter(start=100)
    fit([first, second, CheckpointSaver(tmp_path)], epochs=1)
    states = load(tmp_path / "ep1-ba3-rank0.pt")["callbacks"]
    name = f"{Counter.__module__}.Counter"
    assert states[f"{name}#0"]["epochs"] == 1
    assert states[f"{name}#1"]["epochs"] == 101
    a, b = Counter(), Counter()
    Trainer(
        TinyModel(), make_loader(3), "2ep", callbacks=[a, b, CheckpointSaver(tmp_path / "2")],
        load_path=tmp_path / "ep1-ba3-rank0.pt", device="cpu",
    )  # fmt: skip
    assert (a.epochs, b.epochs) == (1, 101)
    assert isinstance(a.seen, collections.deque) and a.seen.maxlen == 4


def test_callbacks_missing_on_either_side_are_named(tmp_path: pathlib.Path) -> None:
    fit([Counter(), CheckpointSaver(tmp_path)], epochs=1)
    path = tmp_path / "ep1-ba3-rank0.pt"
    name = f"{Counter.__module__}.Counter"
    with pytest.warns(CheckpointWarning, match=rf"holds the state of callback {name}#0, which"):
        Trainer(TinyModel(), make_loader(3), "1ep", callbacks=[CheckpointSaver(tmp_path)],
                load_path=path, device="cpu")  # fmt: skip
    with pytest.warns(CheckpointWarning, match=rf"callback {name}#1 has state but is not in"):
        Trainer(TinyModel(), make_loader(3), "1ep", load_path=path, device="cpu",
                callbacks=[Counter(), Counter(), CheckpointSaver(tmp_path)])  # fmt: skip


def test_pruning_keeps_the_newest(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, "b{batch}.pt", save_interval="1ba", num_checkpoints_to_keep=2)
    fit([saver])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b5.pt", "b6.pt"]
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [5, 6]


def test_pruning_continues_after_resume(tmp_path: pathlib.Path) -> None:
    def saver() -> CheckpointSaver:
        return CheckpointSaver(
            tmp_path, "b{batch}.pt", save_interval="1ba", num_checkpoints_to_keep=2
        )

    fit([saver()], epochs=1)
    fit([saver()], epochs=2, load_path=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b5.pt", "b6.pt"]


def test_subfolders_in_filename_and_rank(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, "rank{rank}/e{epoch}/b{batch}.pt", save_interval="2ba")
    fit([saver])
    assert [p for _, [p] in saver.saved_checkpoints] == [
        tmp_path / "rank0/e0/b2.pt",
        tmp_path / "rank0/e1/b4.pt",
        tmp_path / "rank0/e1/b6.pt",
    ]
    assert find_checkpoint(tmp_path) is None  # a folder search looks at the top level only


def test_weights_only(tmp_path: pathlib.Path) -> None:
    fit([CheckpointSaver(tmp_path, weights_only=True)], epochs=1)
    ckpt = load(tmp_path / "ep1-ba3-rank0.pt")
    assert set(ckpt) == {"trainbus_checkpoint", "weights_only", "timestamp", "model"}
    trained = ckpt["model"]
    trainer = Trainer(TinyModel(), make_loader(3), "1ep", load_path=tmp_path, device="cpu")
    assert int(trainer.state.timer.batch) == 0  # weights only: training starts over
    assert torch.equal(trainer.state.model.state_dict()["lin.weight"], trained["lin.weight"])


def test_overwrite(tmp_path: pathlib.Path) -> None:
    """A name the run itself saves twice (no batch in it) needs overwrite=True; a name of a
    later batch than the run's start is another attempt's future, moved aside (below)."""
    with pytest.raises(FileExistsError, match=r"ep0.pt' exists; pass overwrite=True"):
        fit([CheckpointSaver(tmp_path, "ep{epoch}.pt", save_interval="1ba")], epochs=1)
    assert load(tmp_path / "ep0.pt")["timer"]["batch"] == 1  # the first save, kept
    fit([CheckpointSaver(tmp_path, "ep{epoch}.pt", save_interval="1ba", overwrite=True)], epochs=1)
    assert load(tmp_path / "ep0.pt")["timer"]["batch"] == 3  # the last save replaced it


def test_write_error_is_raised_from_fit(tmp_path: pathlib.Path, no_leaked_threads: None) -> None:
    (tmp_path / "blocker").write_text("a file where the saver wants a folder")
    saver = CheckpointSaver(tmp_path, "blocker/b{batch}.pt", save_interval="1ba")
    trainer = Trainer(TinyModel(), make_loader(3), "2ep", callbacks=[saver], device="cpu")
    with pytest.raises(OSError, match="blocker") as info:
        trainer.fit_sync()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "while CheckpointSaver wrote" in notes
    assert "CheckpointSaver" in notes
    assert int(trainer.state.timer.batch) < 6  # the run stopped early
    assert saver.saved_checkpoints == []


def test_write_error_of_the_last_save_is_raised_at_close(tmp_path: pathlib.Path) -> None:
    (tmp_path / "blocker").write_text("x")
    saver = CheckpointSaver(tmp_path, "blocker/e{epoch}.pt")  # only at the end: 1 epoch
    trainer = Trainer(TinyModel(), make_loader(3), "1ep", callbacks=[saver], device="cpu")
    with pytest.raises(OSError, match="blocker"):
        trainer.fit_sync()
    assert int(trainer.state.timer.epoch) == 1


@pytest.mark.anyio
async def test_async_fit_under_both_backends(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, save_interval="1ba")
    trainer = Trainer(TinyModel(), make_loader(2), "1ep", callbacks=[saver], device="cpu")
    await trainer.fit()
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_checkpoints_to_keep": 0}, "num_checkpoints_to_keep=0 must be -1"),
        ({"filename": "x{step}.pt"}, "filename='x{step}.pt' has a field"),
        ({"save_interval": "3xx"}, "save_interval"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointSaver("c", **kwargs)


CHILD = textwrap.dedent(
    """
    import io, sys, time, torch
    sys.path.insert(0, {repo!r})
    from tests.helpers import TinyModel, make_loader
    from trainbus import Trainer
    from trainbus.callbacks import CheckpointSaver

    real_save, calls = torch.save, []
    def save(obj, f, *args, **kwargs):  # the second checkpoint dies half-way through
        calls.append(1)
        if len(calls) == 2:
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            print("HALF-WRITTEN", flush=True)
            time.sleep(600)
        return real_save(obj, f, *args, **kwargs)
    torch.save = save
    saver = CheckpointSaver({folder!r}, save_interval="1ba")
    model = TinyModel()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)  # AdamW would import torch._dynamo: slow
    trainer = Trainer(model, make_loader(3), "1ep", optimizers=sgd, callbacks=[saver], device="cpu")
    trainer.fit_sync()
    """
)


def test_interrupted_write_leaves_nothing_under_the_final_name(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ckpt"
    script = CHILD.format(repo=str(REPO), folder=str(folder))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "HALF-WRITTEN"
    finally:
        child.send_signal(signal.SIGKILL)  # a crash in the middle of the write
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    names = sorted(p.name for p in folder.iterdir())
    assert names[0].startswith(".ep0-ba2-rank0.pt.partial-")  # the torn temporary file
    assert names[1:] == ["ep0-ba1-rank0.pt"]  # nothing under the second final name
    assert find_checkpoint(folder) == folder / "ep0-ba1-rank0.pt"
    model = TinyModel()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, make_loader(3), "1ep", optimizers=sgd, load_path=folder, device="cpu")
    assert int(trainer.state.timer.batch) == 1


def test_a_fixed_name_is_not_overwritten_by_a_later_save(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, "latest.pt", save_interval="1ba")
    trainer = Trainer(TinyModel(), make_loader(3), "1ep", callbacks=[saver], device="cpu")
    with pytest.raises(FileExistsError, match=r"latest\.pt"):
        trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 2  # the second save refused, the run stopped
    assert load(tmp_path / "latest.pt")["timer"]["batch"] == 1


def test_a_fixed_name_with_overwrite_holds_the_latest(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, "latest.pt", save_interval="1ba", overwrite=True)
    fit([saver], epochs=1)
    assert load(tmp_path / "latest.pt")["timer"]["batch"] == 3
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [3]  # one file, listed once


class SlowBatchCounter(Callback):
    """A plain handler that trails training (its own thread, no barrier to wait for it)."""

    def __init__(self) -> None:
        self.batches = 0

    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.005)  # the workload: slower than a batch
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}


@pytest.mark.parametrize("kwargs", [{"barriers": ()}, {"max_lag": 2}])
def test_late_callbacks_are_captured_as_of_the_save(
    tmp_path: pathlib.Path, kwargs: dict[str, Any]
) -> None:
    saver = CheckpointSaver(tmp_path, "b{batch}.pt", save_interval="1ba")
    fit([SlowBatchCounter(), saver], n_batches=4, epochs=1, **kwargs)
    key = f"{SlowBatchCounter.__module__}.SlowBatchCounter#0"
    for batch in range(1, 5):
        assert load(tmp_path / f"b{batch}.pt")["callbacks"][key]["batches"] == batch


class FailAt(Callback):
    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_checkpoint(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            raise RuntimeError("boom")


def test_a_failed_run_still_finishes_the_write_in_flight(
    tmp_path: pathlib.Path, no_leaked_threads: None
) -> None:
    saver = CheckpointSaver(tmp_path, "b{batch}.pt", save_interval="1ba")
    trainer = Trainer(
        TinyModel(), make_loader(4), "1ep", callbacks=[saver, FailAt(2)], device="cpu"
    )
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit_sync()
    stats = saver.statistics()
    assert stats.saves == stats.written >= 2  # close waited for every captured checkpoint
    assert not list(tmp_path.glob(".*partial-*"))


# -- planted links and the user's files in the folder (issue 46) -----------------------------


def outside_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder outside the saver's that looks like a sharded checkpoint, and its contents."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in (".metadata", "__0_0.distcp", "notes.txt"):
        (outside / name).write_text(name)
    return outside


def test_pruning_does_not_follow_a_kept_checkpoint_swapped_for_a_symlink(
    tmp_path: pathlib.Path,
) -> None:
    """Regression: pruning took the link for a sharded folder and deleted the ``.metadata``
    of the folder it points to."""
    outside = outside_folder(tmp_path)
    folder = tmp_path / "ckpt"
    saver = CheckpointSaver(folder, "b{batch}.pt", save_interval="1ba", num_checkpoints_to_keep=2)

    def swap(timestamp: Any, path: pathlib.Path) -> None:
        if int(timestamp.batch) == 1:  # written, kept for now: swapped for a link
            path.unlink()
            path.symlink_to(outside, target_is_directory=True)

    saver.add_listener(swap)
    fit([saver])
    assert sorted(p.name for p in outside.iterdir()) == [".metadata", "__0_0.distcp", "notes.txt"]
    assert (folder / "b1.pt").is_symlink()  # left alone: not the saver's
    assert sorted(p.name for p in folder.iterdir()) == ["b1.pt", "b5.pt", "b6.pt"]


def test_removing_a_sharded_folder_deletes_only_its_regular_files(tmp_path: pathlib.Path) -> None:
    from trainbus.checkpoint.cleanup import remove_checkpoint

    outside = outside_folder(tmp_path)
    ckpt = tmp_path / "ep1-ba4"
    ckpt.mkdir()
    for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
        (ckpt / name).write_text(name)
    (ckpt / "notes").mkdir()
    (ckpt / "notes" / "draft.txt").write_text("mine")
    (ckpt / "link").symlink_to(outside / "notes.txt")
    remove_checkpoint(ckpt)
    assert sorted(p.name for p in ckpt.iterdir()) == ["link", "notes"]  # not the saver's
    assert (ckpt / "notes" / "draft.txt").read_text() == "mine"
    assert (outside / "notes.txt").read_text() == "notes.txt"

    link = tmp_path / "ep1-ba8"
    link.symlink_to(outside, target_is_directory=True)
    remove_checkpoint(link)  # a link under a checkpoint's name: left alone
    assert link.is_symlink() and len(list(outside.iterdir())) == 3

    (ckpt / "notes" / "draft.txt").unlink()
    (ckpt / "notes").rmdir()
    (ckpt / "link").unlink()
    (ckpt / ".metadata").write_text("")
    remove_checkpoint(ckpt)
    assert not ckpt.exists()  # only the saver's files in it: the folder goes too


@pytest.mark.parametrize("filename", ["b{batch}.pt", "rank{rank}/b{batch}.pt"])
def test_stale_partial_cleanup_leaves_the_users_subfolders_and_links_alone(
    tmp_path: pathlib.Path, filename: str
) -> None:
    """Regression: the cleanup searched every subfolder and deleted a user's
    ``notes/.draft.txt.partial-cafef00d``."""
    folder = tmp_path / "ckpt"
    ours = folder / filename.format(batch=9, rank=0)  # where a killed save's partial lies
    ours.parent.mkdir(parents=True)
    stale = ours.with_name(f".{ours.name}.partial-0123abcd")
    stale.write_bytes(b"half a checkpoint")
    draft = folder / "notes" / ".draft.txt.partial-cafef00d"
    draft.parent.mkdir()
    draft.write_text("the user's draft")
    outside = outside_folder(tmp_path)
    target = outside / ".b1.pt.partial-deadbeef"
    target.write_text("outside")
    (folder / ".b2.pt.partial-deadbeef").symlink_to(target)  # named as ours, but a link
    (folder / "rank1").symlink_to(outside, target_is_directory=True)  # a planted folder link
    past = time.time() - 60
    for p in (stale, draft, target):
        os.utime(p, (past, past))

    fit([CheckpointSaver(folder, filename, save_interval="1ba")], epochs=1)
    assert not stale.exists()  # the saver's own leftover is cleaned up
    assert draft.read_text() == "the user's draft"
    assert (folder / ".b2.pt.partial-deadbeef").is_symlink()
    assert target.read_text() == "outside"
