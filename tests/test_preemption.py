"""``Trainer(preemption=...)``: SIGTERM stops at the next batch with a checkpoint and exits 143.

These run in the pytest process (its main thread), with the signal sent by a callback to
the process itself; ``tests/test_crash_consistency.py`` sends it from outside to a child.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import trainbus
from tests.helpers import TinyModel, make_trainer
from trainbus import Callback, CallbackSignatureError, Preemption, TrainingPreempted
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger


class SigtermAt(Callback):
    """Sends SIGTERM to this process at one batch's end."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_checkpoints_where_training_stopped_and_fit_sync_exits_143(
    tmp_path: Path,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    saver = CheckpointSaver(tmp_path / "ckpt", save_interval="100ba")  # never due by itself
    log = JSONLinesLogger(tmp_path / "m.jsonl")
    trainer = make_trainer(20, callbacks=[saver, SigtermAt(5)], loggers=[log], preemption=True)
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit_sync()
    assert caught.value.code == 143
    assert trainer.preempted
    # The process is ending with 143: a second SIGTERM (torchrun's, as it ends the other
    # workers) ends it at once with that status, not with -15.
    assert signal.getsignal(signal.SIGTERM) not in (before, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, before)  # this test process goes on
    stopped = int(trainer.state.timestamp.batch)
    assert 5 <= stopped < 20
    [(timestamp, [_path])] = saver.saved_checkpoints
    assert int(timestamp.batch) == stopped  # the last batch trained on is saved

    saver2 = CheckpointSaver(tmp_path / "ckpt", save_interval="100ba")
    log2 = JSONLinesLogger(tmp_path / "m.jsonl")
    resumed = make_trainer(20, callbacks=[saver2], loggers=[log2], load_path=tmp_path / "ckpt")
    resumed.fit_sync()
    assert int(resumed.state.timestamp.batch) == 20
    steps = [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 21))  # each batch's loss once


def test_without_preemption_no_handler_is_installed(tmp_path: Path) -> None:
    seen = []

    class Look(Callback):
        def fit_start(self, state: Any, logger: Any) -> None:
            seen.append(signal.getsignal(signal.SIGTERM))

    make_trainer(2, callbacks=[Look()]).fit_sync()
    assert seen == [signal.SIG_DFL]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"signals": (signal.SIGINT,)}, ValueError, "must not include SIGINT"),
        ({"signals": ("TERM",)}, TypeError, "signals="),
        ({"exit_code": 300}, ValueError, "exit_code=300"),
        ({"grace": 0}, ValueError, "grace=0"),
        ({"signals": ()}, None, ""),  # no signal: trainer.preempt() only
    ],
)
def test_bad_preemption_arguments_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception] | None, match: str
) -> None:
    if error is None:
        assert Preemption(**kwargs).signals == ()
        return
    with pytest.raises(error, match=match):
        Preemption(**kwargs)


def test_preemption_argument_is_checked() -> None:
    with pytest.raises(TypeError, match="preemption="):
        make_trainer(2, preemption="yes")


def test_a_preemption_object_sets_the_exit_status(tmp_path: Path) -> None:
    trainer = make_trainer(
        20, callbacks=[SigtermAt(2)], preemption=Preemption(exit_code=99, grace=5)
    )
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit_sync()
    assert caught.value.code == 99


# -- one notice from any source: trainer.preempt(), state.preemption, preemption_notice -----


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.anyio
async def test_preempt_from_another_task_stops_at_the_next_boundary_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    at_three, given = anyio.Event(), anyio.Event()

    class Cue(Callback):
        async def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 3:
                at_three.set()
                await given.wait()  # the barrier at batch 3 holds until preempt() returned

    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="100ba")
    trainer = make_trainer(20, callbacks=[saver, Cue()])
    assert trainer.state.preemption is None and not trainer.preempted
    seen: list[Any] = []

    async def maintenance() -> None:
        await at_three.wait()
        seen.append(trainer.state.preemption)  # None until the call
        assert trainer.preempt("maintenance") is True
        assert trainer.preempt("again") is False  # one notice: the first wins
        given.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(maintenance)
        await trainer.fit()
    notice = trainer.state.preemption
    assert seen == [None]
    assert trainer.preempted and notice is not None
    assert (notice.reason, notice.source, notice.signum) == ("maintenance", "call", None)
    assert 0 < notice.time_left() <= 30.0  # the default grace, from now
    assert int(trainer.state.timestamp.batch) == 3  # the boundary right after the call
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [3]

    resumed = make_trainer(20, load_path=tmp_path / "ckpt" / "ba3.pt")
    await resumed.fit()
    uninterrupted = make_trainer(20)
    await uninterrupted.fit()
    got, want = _weights(resumed.state.model), _weights(uninterrupted.state.model)
    assert all(torch.equal(got[k], want[k]) for k in want)


class AnnouncesAt(Callback):
    """Announces a preemption (as ``RayReporter`` does Ray's drain) from one batch on; counts
    how often the training loop asked."""

    def __init__(self, batch: int, deadline: float | None) -> None:
        self.batch, self.deadline = batch, deadline
        self.asked: list[int] = []
        self.state: Any = None  # the trainer's (a handler's state is frozen at its event)

    def pending_preemption(self) -> tuple[str, float | None] | None:
        batch = int(self.state.timer.batch)  # asked on the training thread: the live timer
        self.asked.append(batch)
        return ("the cluster drains this node", self.deadline) if batch >= self.batch else None


@pytest.mark.parametrize("deadline_in", [45.0, None])
def test_an_announced_preemption_is_given_at_the_next_boundary_with_its_deadline(
    tmp_path: Path, deadline_in: float | None
) -> None:
    import time

    deadline = None if deadline_in is None else time.monotonic() + deadline_in
    announcer = AnnouncesAt(4, deadline)
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="100ba")
    trainer = make_trainer(20, callbacks=[saver, announcer])
    announcer.state = trainer.state
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    notice = trainer.state.preemption
    assert notice is not None
    assert (notice.reason, notice.source) == ("the cluster drains this node", "call")
    if deadline is not None:
        assert notice.deadline == deadline  # the announced deadline, as given
    else:
        assert 0 < notice.time_left() <= 30.0  # the grace period
    # Asked at each boundary while there was no notice, never after: batches 1..4.
    assert announcer.asked == [1, 2, 3, 4]
    assert int(trainer.state.timestamp.batch) == 4  # a single process stops at that boundary
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [4]


def test_a_run_without_an_announcer_polls_nothing() -> None:
    trainer = make_trainer(2, callbacks=[SigtermAt(99)])
    assert trainer._poll_notices is None  # the loop's boundary: one `is None` check


class PreemptAt(Callback):
    """Gives ``trainer.preempt(reason)`` at one batch's end (a plain handler: any thread)."""

    def __init__(self, batch: int, reason: str) -> None:
        self.batch, self.reason = batch, reason
        self.trainer: Any = None

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.batch:
            self.trainer.preempt(self.reason)


@pytest.mark.parametrize("reachable", [False, True])
def test_a_preempted_fit_ends_with_one_line_naming_its_checkpoint_and_what_was_left(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], reachable: bool
) -> None:
    """Issue 40: what cannot finish stays in the spool or journal, and the stderr line names
    it. The uploader's server refuses every connection (or accepts every batch)."""
    from tests.loggers.test_http_uploader import MetricsServer
    from trainbus.loggers import HTTPMetricsUploader, MetricsUploadWarning

    server = MetricsServer(listen=reachable)
    try:
        spool = tmp_path / "spool"
        uploader = HTTPMetricsUploader(
            server.url, batch_size=2, spool_dir=spool, close_timeout=0.5, backoff=0.05
        )
        saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="100ba")
        cue = PreemptAt(3, "maintenance")
        trainer = make_trainer(
            20, callbacks=[saver, cue], loggers=[uploader, JSONLinesLogger(tmp_path / "m.jsonl")]
        )
        cue.trainer = trainer
        warned = contextlib.nullcontext() if reachable else pytest.warns(MetricsUploadWarning)
        with pytest.raises(TrainingPreempted), warned:
            trainer.fit_sync()
    finally:
        server.close()
    stats = uploader.statistics()
    [line] = [ln for ln in capfd.readouterr().err.splitlines() if "stopped after batch" in ln]
    written = str(saver.saved_checkpoints[-1][1][0])
    head = f"trainbus: maintenance: stopped after batch 3; checkpoint {written!r}"
    if reachable:
        assert stats.pending_points == 0 and sum(server.points().values()) == 3
        assert line == f"{head}; HTTPMetricsUploader: all delivered"
    else:
        assert stats.pending_points == 3  # loss/train at batches 1-3, in 2 batches of 2 and 1
        assert line == (
            f"{head}; left undelivered: HTTPMetricsUploader: 3 points in 2 batches, "
            f"in spool_dir={str(spool)!r} for the next run"
        )
        assert len(list(spool.glob("*.json*"))) >= 1  # what the line says is on disk


def test_an_async_callback_gets_the_notice_while_the_training_thread_is_inside_a_batch(
    tmp_path: Path,
) -> None:
    inside, release = threading.Event(), threading.Event()

    class LongBatch(TinyModel):
        def forward(self, batch: Any) -> torch.Tensor:
            if self.training and self.training_forwards == 2:  # batch 3's forward
                inside.set()
                assert release.wait(30), "preemption_notice never ran during the batch"
            return super().forward(batch)

    class Flush(Callback):
        def __init__(self) -> None:
            self.got: list[tuple[str, float, int, bool]] = []

        async def preemption_notice(self, state: Any, logger: Any) -> None:
            notice = state.preemption
            self.got.append(
                (notice.reason, notice.time_left(), int(state.timer.batch), inside.is_set())
            )
            release.set()  # the training thread is still in batch 3 until now

    flush = Flush()
    trainer = make_trainer(
        10, callbacks=[flush], model=LongBatch(), preemption=Preemption(grace=12)
    )

    def spot_poller() -> None:
        assert inside.wait(30)
        trainer.preempt("spot notice")

    poller = threading.Thread(target=spot_poller)
    poller.start()
    with pytest.raises(TrainingPreempted) as caught:
        trainer.fit_sync()  # the notice is the same as a signal's: exit 143
    poller.join()
    assert caught.value.code == 143
    [(reason, left, batch, during)] = flush.got
    assert (reason, batch, during) == ("spot notice", 2, True)  # batch 3 not finished
    assert 0 < left <= 12
    assert int(trainer.state.timestamp.batch) == 3


def test_a_plain_preemption_notice_handler_is_refused() -> None:
    class Plain(Callback):
        def preemption_notice(self, state: Any, logger: Any) -> None: ...

    with pytest.raises(CallbackSignatureError, match="must be `async def preemption_notice"):
        make_trainer(2, callbacks=[Plain()])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("",), ValueError, "reason=''"),
        ((None,), ValueError, "reason=None"),
        (("x", "soon"), TypeError, "deadline='soon' must be a time.monotonic"),
    ],
)
def test_bad_preempt_arguments_name_the_argument(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_trainer(2).preempt(*args)


def test_grace_defaults_from_torchrun_then_ours_then_30_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    monkeypatch.delenv("TRAINBUS_PREEMPTION_GRACE", raising=False)
    assert (Preemption().seconds, Preemption().seconds_from) == (30.0, "default")
    monkeypatch.setenv("TRAINBUS_PREEMPTION_GRACE", "75")
    assert (Preemption().seconds, Preemption().seconds_from) == (75.0, "TRAINBUS_PREEMPTION_GRACE")
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "8")
    p = Preemption()
    assert (p.seconds, p.seconds_from) == (8.0, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert Preemption(grace=5).seconds == 5.0  # the argument wins
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TORCH_ELASTIC_SHUTDOWN_TIMEOUT='soon' must be"):
        Preemption()


def test_preemption_is_on_by_default_under_a_launcher_with_a_checkpoint_saver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK"):
        monkeypatch.delenv(name, raising=False)
    saver = CheckpointSaver(tmp_path / "ckpt")
    assert make_trainer(2, callbacks=[saver]).preemption is None  # no launcher
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert make_trainer(2).preemption is None  # no saver
    assert make_trainer(2, callbacks=[CheckpointSaver(tmp_path / "a")]).preemption is not None
    off = make_trainer(2, callbacks=[CheckpointSaver(tmp_path / "b")], preemption=False)
    assert off.preemption is None


def test_a_deadline_already_past_says_so(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 58: with a deadline already past, the watchdog said "did not reach its
    checkpoint within 0.0 s; abandoning the stuck handler(s) a handler": the reason is the
    deadline, and the handler it names is the one that holds the run (here the ``@blocking``
    handler that gave the notice and waits for the watchdog's save), never "a handler"."""
    import time

    from trainbus import blocking

    saver = CheckpointSaver(tmp_path / "ckpt", save_interval="100ep")

    class NoticeAtBatch2(Callback):
        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 2:
                assert trainer.preempt("maintenance", deadline=time.monotonic() - 1)
                assert saver._requested_captured.wait(timeout=60)  # the watchdog saved

    trainer = make_trainer(4, callbacks=[NoticeAtBatch2(), saver])
    anyio.run(trainer.fit)  # a call never ends the process: fit() returns
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "did not reach its checkpoint" in ln]
    assert len(lines) == 1, err
    assert "handler(s) a handler" not in lines[0] and "within 0.0 s" not in lines[0]
    assert "handler(s) test_a_deadline_already_past_says_so.<locals>.NoticeAtBatch2" in lines[0]
    assert "before its deadline, which had already passed when the notice came" in lines[0]
    assert trainer.preempted
    assert [p.name for _, [p] in saver.saved_checkpoints] == ["ep0-ba2-rank0.pt"]


# -- the phases of one process, in the test's process (issue 53) --------------------------


class PreemptIn(Callback):
    """Calls ``trainer.preempt()`` from ``fit_start`` (blocking: no batch trained yet) or
    from ``close`` (every batch trained, the loop done)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.trainer: Any = None

    @trainbus.blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        if self.where == "fit_start":
            self.trainer.preempt("before the first batch")

    def close(self, state: Any, logger: Any) -> None:
        if self.where == "close":
            self.trainer.preempt("while closing")


def test_a_notice_before_the_first_batch_saves_nothing(tmp_path: Path) -> None:
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="100ba")
    at = PreemptIn("fit_start")
    trainer = make_trainer(6, callbacks=[saver, at])
    at.trainer = trainer
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    assert int(trainer.state.timestamp.batch) == 0
    assert saver.saved_checkpoints == []  # no batch trained: nothing to save
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_a_notice_while_the_callbacks_close_writes_the_last_batch_at_once(
    tmp_path: Path,
) -> None:
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="4ba")
    at = PreemptIn("close")
    trainer = make_trainer(6, callbacks=[at, saver])  # `at` closes first: the saver after
    at.trainer = trainer
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [4, 6]
    assert (tmp_path / "ckpt" / "ba6.pt").is_file()  # no checkpoint event came after it


def test_the_stop_report_is_written_where_the_variable_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINBUS_STOP_REPORT", str(tmp_path / "reports" / "stop-{rank}.json"))
    saver = CheckpointSaver(tmp_path / "ckpt", "ba{batch}.pt", save_interval="100ba")
    at = PreemptIn("close")
    trainer = make_trainer(3, callbacks=[at, saver])
    at.trainer = trainer
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    report = json.loads((tmp_path / "reports" / "stop-0.json").read_text())
    assert report["preempted"] is True and report["reason"] == "while closing"
    assert (report["rank"], report["world_size"], report["batch"]) == (0, 1, 3)
    assert report["checkpoint"] == str(tmp_path / "ckpt" / "ba3.pt")
    assert (report["exit_code"], report["source"], report["signal"]) == (143, "call", None)


def test_a_stop_report_that_cannot_be_written_is_named_and_the_stop_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TRAINBUS_STOP_REPORT", str(tmp_path / "file" / "stop.json"))
    at = PreemptIn("close")
    trainer = make_trainer(2, callbacks=[at])
    at.trainer = trainer
    with pytest.raises(TrainingPreempted):
        trainer.fit_sync()
    assert "the stop report could not be written" in capsys.readouterr().err


def test_peer_notices_reach_the_other_rank_at_once_through_a_real_store() -> None:
    """Two ranks' channels on one real ``TCPStore`` (127.0.0.1, port 0): a notice sent by
    one is given on the other by its thread, with the seconds left; close ends each thread."""
    import torch.distributed as dist

    from trainbus.runtime.peer_notices import PeerNotices

    server = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    got: list[tuple[int, float]] = []
    given = threading.Event()

    def on_notice(signum: int, left: float) -> None:
        got.append((signum, left))
        given.set()

    def channel(rank: int, on: Any) -> PeerNotices:
        def client() -> Any:
            return dist.TCPStore("127.0.0.1", server.port, 2, is_master=False)

        peers = PeerNotices(client(), client(), "test/0", rank, 2)
        peers._thread = threading.Thread(target=peers._listen, args=(on,), daemon=True)
        peers._thread.start()
        return peers

    zero, one = channel(0, on_notice), channel(1, lambda s, left: None)
    one.send(signal.SIGTERM, 7.5)
    assert given.wait(30)
    assert got == [(int(signal.SIGTERM), 7.5)]
    threads = [zero._thread, one._thread]
    zero.close()
    one.close()
    assert not any(t is not None and t.is_alive() for t in threads)
