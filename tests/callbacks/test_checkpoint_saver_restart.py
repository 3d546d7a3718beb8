"""A saver restarted from an older checkpoint than its folder's newest (issue 53, item 2).

Real files, real runs: a run restarted from checkpoint N (a user's ``load_path``, a copy of
it elsewhere as Ray hands it back, or none at all) moves the folder's checkpoints of later
batches into ``abandoned/after-ba<N>/`` (nothing deleted) and runs to the end with the
uninterrupted run's weights, where it used to stop with ``FileExistsError``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import CheckpointWarning, Trainer
from trainbus.callbacks import CheckpointSaver
from trainbus.checkpoint.abandoned import later_checkpoints, name_pattern
from trainbus.core.timer import Timestamp

#: What a 2-epoch run of 3 batches saving every batch leaves (the epoch counts at its end).
ALL = [f"ep{(b - 1) // 3}-ba{b}-rank0.pt" for b in range(1, 7)]


def _trainer(folder: pathlib.Path, **kw: Any) -> Trainer:
    model = TinyModel()
    return Trainer(
        model, make_loader(3), "2ep", optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        device="cpu", seed=1, callbacks=[CheckpointSaver(folder, save_interval="1ba")], **kw,
    )  # fmt: skip


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [t.clone() for t in trainer.state.model.state_dict().values()]


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def full_run(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[torch.Tensor], dict[str, bytes]]:
    """The uninterrupted run: its folder, final weights and every file it wrote."""
    folder = tmp_path / "ckpt"
    trainer = _trainer(folder)
    trainer.fit_sync()
    files = _files(folder)
    assert sorted(files) == sorted(ALL)
    return folder, _weights(trainer), files


@pytest.mark.parametrize("where", ["in the folder", "a copy elsewhere"])
def test_a_restart_from_an_older_checkpoint_moves_the_later_ones_aside_and_runs_to_the_end(
    tmp_path: pathlib.Path, full_run: Any, where: str
) -> None:
    folder, weights, before = full_run
    load_path = folder / "ep0-ba2-rank0.pt"
    if where == "a copy elsewhere":  # as Ray hands back its registered copy
        (tmp_path / "ray").mkdir()
        load_path = pathlib.Path(shutil.copy2(load_path, tmp_path / "ray"))
    resumed = _trainer(folder, load_path=load_path)
    with pytest.warns(CheckpointWarning, match=r"starts at batch 2 .* holds 4 checkpoint.*"
                      r"'ep0-ba3-rank0\.pt'.* moved to .*abandoned/after-ba2'"):  # fmt: skip
        resumed.fit_sync()
    assert all(torch.equal(a, b) for a, b in zip(weights, _weights(resumed), strict=True))
    after = _files(folder)
    moved = {f"abandoned/after-ba2/{name}": before[name] for name in ALL[2:]}
    assert {k: v for k, v in after.items() if k.startswith("abandoned/")} == moved
    assert sorted(k for k in after if not k.startswith("abandoned/")) == sorted(ALL)
    for name in ALL[:2]:  # the checkpoints up to the restart are left as they were
        assert after[name] == before[name]


def test_a_fresh_start_in_a_used_folder_moves_everything_aside_each_time(
    full_run: Any,
) -> None:
    """Ray restarting a group that registered no checkpoint yet: load_path=None."""
    folder, weights, before = full_run
    for target in ("after-ba0", "after-ba0-2"):
        again = _trainer(folder)
        with pytest.warns(CheckpointWarning, match=rf"holds 6 .*{target}'"):
            again.fit_sync()
        assert all(torch.equal(a, b) for a, b in zip(weights, _weights(again), strict=True))
        assert sorted(p.name for p in (folder / "abandoned" / target).iterdir()) == sorted(ALL)
    assert _files(folder / "abandoned" / "after-ba0") == before  # the first attempt's, intact


def test_autoresume_from_the_newest_moves_nothing(full_run: Any) -> None:
    folder, _, before = full_run
    trainer = _trainer(folder, load_path=folder)
    trainer.fit_sync(duration="2ep")  # from epoch 1 (its end not yet counted) to 3
    assert not (folder / "abandoned").exists()
    after = _files(folder)
    assert {k: after[k] for k in before} == before  # none of 1-6 touched
    assert sorted(set(after) - set(before)) == [f"ep2-ba{b}-rank0.pt" for b in (7, 8, 9)]


def test_later_checkpoints_follows_the_filename_template(tmp_path: pathlib.Path) -> None:
    """Subfolders as deep as the template, the first of batch/sample/token/epoch orders, a
    link and the abandoned folder are never taken, a fixed name orders nothing."""
    folder = tmp_path / "ckpt"
    for rel in ("rank0/b2.pt", "rank0/b7.pt", "rank1/b9.pt", "rank0/notes.txt", "b9.pt",
                "abandoned/rank0/b8.pt", "rank0/sub/b9.pt"):  # fmt: skip
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"x")
    os.symlink(folder / "rank0" / "b7.pt", folder / "rank0" / "b8.pt")
    start = Timestamp(epoch=1, batch=4)
    found = later_checkpoints(folder, ("rank{rank}/b{batch}.pt",), start)
    assert [p.relative_to(folder).as_posix() for p in found] == ["rank0/b7.pt", "rank1/b9.pt"]
    (folder / "e3").mkdir()  # a sharded checkpoint's folder: ordered by epoch, no batch
    (folder / "e1").mkdir()
    assert [p.name for p in later_checkpoints(folder, ("e{epoch}",), start)] == ["e3"]
    assert later_checkpoints(folder, ("latest.pt",), start) == []
    assert name_pattern("b{batch}-{batch}.pt").fullmatch("b3-4.pt") is None  # one value
