"""WandBLogger: offline W&B runs, read back from their files with W&B's own reader."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_trainer
from tests.loggers.wandb_files import offline_env, run_folders, wandb_history, wandb_points
from trainbus import Callback
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import WandBLogger
from trainbus.loggers.wandb_logger import _LogTail, last_history_step, offline_folders


@pytest.fixture
def wandb_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "wb"
    root.mkdir()
    for name, value in offline_env(root).items():
        monkeypatch.setenv(name, value)
    yield root
    import wandb

    wandb.teardown()  # W&B reads its environment once per process setup: start afresh


class Attempt(Callback):
    """Logs ``half`` = batch / 2 + ``offset``: a value that tells which run logged it."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def fit_start(self, state: Any, logger: Any) -> None:
        logger.log_hyperparameters({"lr": 0.1})

    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"half": int(state.timer.batch) * 0.5 + self.offset})


@pytest.mark.slow  # ~15 s under load; the resume test below reads a run back too
def test_a_run_read_back_from_its_offline_files(wandb_root: Path) -> None:
    dest = WandBLogger("p", dir=wandb_root)
    make_trainer(3, 2, [Attempt(0.0)], eval_batches=2, loggers=[dest]).fit_sync()
    history = wandb_history(wandb_root)
    assert list(history) == [dest.run_id]
    rows = history[dest.run_id]
    assert [step for step, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert all({"loss/train", "half"} <= set(items) for _, items in rows)
    assert [items.get("eval/loss") is not None for _, items in rows] == [
        False, False, True, False, False, True,
    ]  # fmt: skip
    assert [items["half"] for _, items in rows] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    (folder,) = run_folders(wandb_root)
    assert last_history_step(folder / f"run-{dest.run_id}.wandb") == 6


def test_resumed_from_an_older_checkpoint_continues_the_run_once_per_step(
    wandb_root: Path, tmp_path: Path
) -> None:
    """The first run (steps 1-4, checkpoints at 2 and 4) is the killed one; the resumed
    run starts from the checkpoint of step 2 and runs to step 8 with other values. The
    one W&B run holds each step once: the killed run's values up to step 4 (the replay
    rule), the resumed run's after."""
    saver = CheckpointSaver(tmp_path / "ckpt", filename="ba{batch}.pt", save_interval="2ba")
    first = WandBLogger("p", dir=wandb_root)
    make_trainer(4, 1, [saver, Attempt(0.0)], loggers=[first]).fit_sync()
    resumed = WandBLogger("p", dir=wandb_root)  # a new id until the checkpoint is loaded
    assert resumed.run_id != first.run_id
    trainer = make_trainer(
        4, 2, [Attempt(1000.0)], loggers=[resumed], load_path=tmp_path / "ckpt" / "ba2.pt"
    )
    assert resumed.run_id == first.run_id
    trainer.fit_sync()
    assert resumed.dropped == 4  # half and loss/train of steps 3 and 4
    points = wandb_points(wandb_root)
    assert list(points) == [first.run_id]  # one run, in two offline folders
    assert len(run_folders(wandb_root)) == 2
    got = points[first.run_id]
    assert Counter((name, step) for name, step, _ in got) == Counter(
        (name, step) for name in ("half", "loss/train") for step in range(1, 9)
    )
    half = {step: value for name, step, value in got if name == "half"}
    assert half == {s: s * 0.5 + (0 if s <= 4 else 1000) for s in range(1, 9)}


def test_a_runs_offline_folders_include_the_ones_wandb_suffixed(tmp_path: Path) -> None:
    """W&B names a folder ``offline-run-<time>-<id>-1`` when a run of that id started in the
    same second (a resume right after the first run, as on a fast machine): the replay rule
    must read it too, and no folder of another id."""
    names = [
        "offline-run-20261203_171900-abc12345", "offline-run-20261203_171900-abc12345-1",
        "offline-run-20261203_171901-abc123456", "offline-run-20261203_171902-xyz98765",
    ]  # fmt: skip
    for name in names:
        (tmp_path / name).mkdir()
    assert [f.name for f in offline_folders(tmp_path, "abc12345")] == names[:2]


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="resume='never' must be 'allow' or 'must'"):
        WandBLogger(resume="never")
    with pytest.raises(ValueError, match="mode='local'"):
        WandBLogger(mode="local")
    with pytest.raises(ValueError, match="run_id=''"):
        WandBLogger(run_id="")
    with pytest.raises(TypeError, match="project=3"):
        WandBLogger(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="settings=1"):
        WandBLogger(settings=1)  # type: ignore[arg-type]


def test_missing_wandb_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[wandb\]'"):
        WandBLogger()


def test_import_trainbus_loggers_does_not_import_wandb() -> None:
    code = (
        "import sys, trainbus, trainbus.loggers\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'wandb']\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_run_that_cannot_open_fails_the_fit_and_leaves_no_thread(wandb_root: Path) -> None:
    dest = WandBLogger("p", dir=wandb_root, settings={"no_such_setting": 1})
    with pytest.raises(Exception, match="no_such_setting"):
        make_trainer(2, 1, loggers=[dest]).fit_sync()
    assert not [t for t in threading.enumerate() if t.name == "trainbus-wandb-init"]


def _transaction_log(steps: list[int], padding: int) -> bytes:
    """A ``.wandb`` file as W&B's writer lays it out (32 KiB blocks, records split into
    first/middle/last parts across blocks), one history record per step, each carrying
    ``padding`` bytes so that some span blocks."""
    from wandb.proto import wandb_internal_pb2

    out = bytearray(b":W&B\xe1\xbe\x00")
    block, header = 32 * 1024, 7
    for step in steps:
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.history.step.num = step
        item = record.history.item.add()
        item.key, item.value_json = "x", "0" * padding
        data, first = record.SerializeToString(), True
        while True:
            left = block - len(out) % block
            if left < header:
                out += b"\0" * left
                continue
            chunk, data = data[: left - header], data[left - header :]
            kind = (1 if not data else 2) if first else (4 if not data else 3)
            out += struct.pack("<IHB", 0, len(chunk), kind) + chunk
            first = False
            if not data:
                break
    return bytes(out)


def test_a_growing_transaction_log_is_read_on_from_where_the_last_read_stopped(
    tmp_path: Path,
) -> None:
    """What a checkpoint reads of the run's own ``.wandb`` file (``_LogTail``): written in
    pieces that cut records (and records split across blocks) anywhere, each read sees the
    last step of the complete records so far, as a read of the whole file does."""
    steps = list(range(1, 41))
    data = _transaction_log(steps, padding=3000)  # ~120 KiB: records span 4 blocks
    path = tmp_path / "run-x.wandb"
    tail = _LogTail(path)
    assert tail.advance() is None  # no file yet
    cuts = sorted({*range(0, len(data), 9973), 32 * 1024 - 3, 32 * 1024, len(data)})
    for cut in cuts:
        path.write_bytes(data[:cut])
        assert tail.advance() == last_history_step(path), cut
    assert tail.advance() == 40
    path.write_bytes(data[:-1])  # the last record torn: the one before it is the last
    assert last_history_step(path) == 39
