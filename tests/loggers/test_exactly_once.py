"""Exactly once by default (issue 32, item 1): an uploader with a ``spool_dir`` journals when
the run has a ``CheckpointSaver``; a resumed run that cannot be exactly once warns once.

The crash itself (SIGKILL, resume, each point once at a real server) is checked with real
processes in ``tests/test_crash_consistency.py``; here, what the Trainer decides.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.helpers import make_trainer
from trainbus import CheckpointWarning
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import HTTPMetricsUploader, MetricsUploadWarning, _exactly_once

URL = "http://127.0.0.1:9/points"  # never contacted: no fit() here


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_exactly_once, "_warned", set())


def test_a_spool_and_a_saver_journal_by_default(tmp_path: Path) -> None:
    uploader = HTTPMetricsUploader(URL, spool_dir=tmp_path / "spool")
    assert not uploader.journal  # undecided until a Trainer knows the run
    make_trainer(2, callbacks=[CheckpointSaver(tmp_path / "ckpt")], loggers=[uploader])
    assert uploader.journal


@pytest.mark.parametrize(
    ("spool", "journal", "saver"), [(True, None, False), (True, False, True), (False, None, True)]
)
def test_otherwise_no_journal(
    tmp_path: Path, spool: bool, journal: bool | None, saver: bool
) -> None:
    uploader = HTTPMetricsUploader(
        URL, spool_dir=tmp_path / "spool" if spool else None, journal=journal
    )
    callbacks = [CheckpointSaver(tmp_path / "ckpt")] if saver else []
    make_trainer(2, callbacks=callbacks, loggers=[uploader])
    assert not uploader.journal


def _checkpoint(tmp_path: Path) -> Path:
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="1ba")
    make_trainer(2, callbacks=[saver], device="cpu").fit_sync()
    return tmp_path / "ckpt" / "ba1.pt"


def test_a_resumed_run_without_a_spool_warns_once(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    with pytest.warns(MetricsUploadWarning, match=r"no spool_dir.*resumes from a checkpoint"):
        make_trainer(2, loggers=[HTTPMetricsUploader(URL)], load_path=checkpoint, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same configuration again: no second warning
        make_trainer(2, loggers=[HTTPMetricsUploader(URL)], load_path=checkpoint, device="cpu")


def test_a_resumed_run_with_journal_false_warns(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    uploader = HTTPMetricsUploader(URL, spool_dir=tmp_path / "spool", journal=False)
    with pytest.warns(MetricsUploadWarning, match=r"journal=False"):
        make_trainer(2, loggers=[uploader], load_path=checkpoint, device="cpu")


def test_a_resumed_run_that_journals_does_not_warn(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path)
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="1ba", overwrite=True)
    uploader = HTTPMetricsUploader(URL, spool_dir=tmp_path / "spool")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)  # the uploader is new to the run
        warnings.simplefilter("error", MetricsUploadWarning)
        make_trainer(2, callbacks=[saver], loggers=[uploader], load_path=checkpoint, device="cpu")
    assert uploader.journal


def test_journal_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match="journal="):
        HTTPMetricsUploader(URL, spool_dir="s", journal="yes")  # type: ignore[arg-type]
