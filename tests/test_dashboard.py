"""The dashboard without a browser: bus snapshots in the stream, the HTTP side, the callback."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer
from trainbus.callbacks import (
    Dashboard,
    EventStream,
    StreamBusSnapshot,
    StreamEvent,
    StreamMetrics,
)
from trainbus.callbacks._dashboard_page import ConnectionHub, dashboard_app
from trainbus.serve import create_app

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "src" / "trainbus" / "callbacks" / "static"
DEADLINE = 30


class Sleepy(Callback):
    """A plain handler that blocks 2 ms per batch: it holds the BATCH_END barrier."""

    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.002)


def trainer_with(stream_or_board: Any, batches: int = 20, callbacks: Any = ()) -> Trainer:
    model = TinyModel()
    return Trainer(model, make_loader(batches), "1ep",
                   optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                   callbacks=list(callbacks), loggers=[stream_or_board])


@pytest.mark.asyncio
async def test_a_watching_stream_publishes_bus_snapshots_and_a_last_one_before_fit_end() -> None:
    stream = EventStream(history=10_000)
    trainer = trainer_with(stream, batches=30, callbacks=[Sleepy()])
    stream.watch(trainer.engine, snapshot_seconds=0.01)
    await trainer.fit()
    items = [item async for item in stream.subscribe(since=0)]
    snaps = [i for i in items if isinstance(i, StreamBusSnapshot)]
    assert len(snaps) >= 2
    assert isinstance(items[-1], StreamEvent) and items[-1].event.value == "fit_end"
    assert items[-2] is snaps[-1]  # the final snapshot comes just before FIT_END
    final = snaps[-1].statistics
    assert final["batches"] == 30
    by_name = {c["name"]: c for c in final["callbacks"]}
    assert by_name["Sleepy"]["handled"] == 30
    assert by_name["Sleepy"]["barrier_wait_caused"] > 0  # it released the barriers
    assert by_name["Sleepy"]["barrier_wait_caused"] > by_name["EventStream"][
        "barrier_wait_caused"
    ]
    rows = {span["row"] for span in snaps[-1].timeline}
    assert {"training thread", "Sleepy"} <= rows
    assert len({s["label"] for s in snaps[-1].timeline if s["label"].startswith("batch")}) <= 7
    data = json.loads(snaps[-1].to_json())
    assert data["type"] == "bus" and data["seq"] == snaps[-1].seq
    assert snaps[-1].to_sse().split("\n")[1] == "event: bus"


class SlowClose(Callback):
    """Its ``close`` returns only ``gap`` seconds after a subscriber saw ``fit_end``.

    Plain callbacks close before logger destinations, so the stream's ``close`` runs at
    least ``gap`` after its ``FIT_END`` handler: many snapshot intervals later.
    """

    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.fit_end_seen = threading.Event()
        self.waited: bool | None = None

    def close(self, state: Any, logger: Any) -> None:
        self.waited = self.fit_end_seen.wait(timeout=DEADLINE)
        time.sleep(self.gap)  # the gap itself (what is waited for is the event above)


@pytest.mark.asyncio
async def test_no_snapshot_follows_fit_end_when_the_close_comes_long_after_it() -> None:
    """Regression: a gap longer than ``interval`` between FIT_END and the stream's close
    made ``close`` publish one more snapshot, after ``fit_end``."""
    stream = EventStream(history=10_000)
    slow = SlowClose(gap=0.2)
    trainer = trainer_with(stream, batches=5, callbacks=[slow])
    stream.watch(trainer.engine, snapshot_seconds=0.02)  # the gap is ten intervals
    seen: list[Any] = []

    async def watch() -> None:
        async for item in stream.subscribe():
            seen.append(item)
            if isinstance(item, StreamEvent) and item.event.value == "fit_end":
                slow.fit_end_seen.set()

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await trainer.fit()
    assert slow.waited is True
    assert isinstance(seen[-1], StreamEvent) and seen[-1].event.value == "fit_end"
    assert isinstance(seen[-2], StreamBusSnapshot)  # the last snapshot, just before it
    assert seen[-2].statistics["batches"] == 5


@pytest.mark.asyncio
async def test_the_feed_keeps_the_recorder_flat() -> None:
    stream = EventStream()
    trainer = trainer_with(stream, batches=50, callbacks=[Sleepy()])
    stream.watch(trainer.engine, snapshot_seconds=0.01)
    await trainer.fit()
    assert stream._feed is not None
    assert len(list(stream._feed.recorder.spans())) < 50  # taken at each snapshot


def test_watch_and_publish_check_their_arguments() -> None:
    stream = EventStream()
    trainer = trainer_with(stream)
    with pytest.raises(ValueError, match="snapshot_seconds=0"):
        stream.watch(trainer.engine, snapshot_seconds=0)
    with pytest.raises(TypeError, match="StreamBusSnapshot"):
        stream.publish("batch_end")  # type: ignore[type-var]
    stream = EventStream()  # a fresh one: the trainer's INIT was item 0 of the other
    first = stream.publish(StreamBusSnapshot({"batches": 0}, (), 0.0, seq=99))
    second = stream.publish(StreamBusSnapshot({"batches": 1}, (), 0.0))
    assert (first.seq, second.seq) == (0, 1)
    with pytest.raises(ValueError, match="port=70000"):
        Dashboard(port=70000)
    with pytest.raises(ValueError, match="snapshot_seconds=-1"):
        Dashboard(snapshot_seconds=-1)


@pytest.mark.asyncio
async def test_job_dashboard_page_static_files_and_the_bus_opt_in() -> None:
    from tests.test_serve import Factory, names, read_all, serving

    with anyio.fail_after(DEADLINE):
        async with serving(create_app(Factory())) as (_, url), httpx.AsyncClient(base_url=url) as c:
            job_id = (await c.post("/jobs", json={"batches": 5})).json()["id"]
            page = await c.get(f"/jobs/{job_id}/dashboard")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert f"trainbus job {job_id}" in page.text
            assert "https://" not in page.text and "http://" not in page.text  # no CDN
            for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
                assert (await c.get(src)).status_code == 200, src
            assert (await c.get("/jobs/nope/dashboard")).status_code == 404
            plain = await read_all(c, job_id)
            assert "bus" not in names(plain)  # curl users see what they saw before
            with_bus = await read_all(c, job_id, "?bus=1")
            assert names(with_bus)[-3:] == ["bus", "fit_end", "end"]
            # ?pack=1: bursts arrive as one `items` message, its id the last item's seq.
            async with c.stream("GET", f"/jobs/{job_id}/events?bus=1&pack=1") as response:
                raw = [line async for line in response.aiter_lines()]
            packed = [json.loads(line[6:]) for line in raw if line.startswith("data: [")]
            flat = [item for message in packed for item in message]
            assert [i["seq"] for i in flat] == [d["seq"] for _, d in with_bus[:-1]]
            ids = [int(line[4:]) for line in raw if line.startswith("id: ")]
            assert ids == [message[-1]["seq"] for message in packed]
            assert raw[-2] == 'data: {"status":"completed","error":null,"dropped":0}'
            # Last-Event-ID wins over ?since= (a reconnecting EventSource sends both).
            last = with_bus[-3][1]["seq"]
            async with c.stream(
                "GET", f"/jobs/{job_id}/events?since=0&bus=1",
                headers={"Last-Event-ID": str(last)},
            ) as response:
                from tests.test_serve import sse_items

                resumed = [item async for item in sse_items(response)]
            assert names(resumed) == ["fit_end", "end"]


def test_a_tab_that_never_reads_does_not_hold_the_run(no_leaked_threads: None) -> None:
    # Snapshots every 10 ms (tens of KiB each) overflow the socket buffers within a second.
    with Dashboard(history=64, snapshot_seconds=0.01) as dashboard:
        trainer = trainer_with(dashboard, batches=1500)
        silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        silent.connect(("127.0.0.1", dashboard.port))
        silent.sendall(b"GET /events?since=0&bus=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        silent.recv(1)  # the response has started: the tab is subscribed
        trainer.fit_sync()  # completes although the tab never reads
        assert dashboard.stream.ended
        stats = dashboard.stream.statistics()
        assert stats.published > 3000
        assert stats.dropped > 0  # the tab lost items; the run lost nothing
        silent.close()
    assert not any(t.name == "trainbus-dashboard" for t in threading.enumerate())


def test_demo_cli_takes_a_dashboard_port(capsys: pytest.CaptureFixture[str]) -> None:
    from trainbus.__main__ import _parser

    assert _parser().parse_args(["demo"]).dashboard is None
    assert _parser().parse_args(["demo", "--dashboard"]).dashboard == 0
    assert _parser().parse_args(["demo", "--dashboard", "8050"]).dashboard == 8050
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo", "--dashboard", "99999"])
    assert "port from 0 to 65535" in capsys.readouterr().err


def test_the_front_end_ships_in_the_package_with_its_licence() -> None:
    vendor = STATIC / "vendor" / "uplot"
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE", "README.md"):
        assert (vendor / name).is_file(), name
    assert "MIT License" in (vendor / "LICENSE").read_text()
    assert "1.6.32" in (vendor / "README.md").read_text()
    for name in ("dashboard.html", "dashboard.js", "dashboard.css"):
        text = (STATIC / name).read_text()
        assert "cdn" not in text.lower() and "https://" not in text, name
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"playwright' in pyproject


def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "dashboard.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_dashboard"}
    exec(compile(block.group(1), "docs/dashboard.md", "exec"), namespace)
    assert namespace["trainer"].state.timestamp.batch == 40


def test_a_dashboard_in_loggers_follows_its_trainers_bus_without_attach() -> None:
    with Dashboard(snapshot_seconds=0.01) as dashboard:
        trainer = trainer_with(dashboard, batches=30, callbacks=[Sleepy()])
        trainer.fit_sync()
        snaps = [i for i in dashboard.stream._history if isinstance(i, StreamBusSnapshot)]
    assert snaps, "no bus snapshot: the engine did not hand the dashboard its bus"
    final = snaps[-1].statistics
    assert final["batches"] == 30
    assert {c["name"] for c in final["callbacks"]} == {"Sleepy", "Dashboard"}
    assert {s["row"] for s in snaps[-1].timeline} >= {"training thread", "Sleepy"}


def test_attach_is_deprecated_and_still_returns_the_dashboard() -> None:
    dashboard = Dashboard()
    trainer = trainer_with(dashboard)
    with pytest.warns(DeprecationWarning, match=r"attach\(trainer\) is no longer needed"):
        assert dashboard.attach(trainer) is dashboard
    assert dashboard._feed is not None and dashboard._feed.engine is trainer.engine


def test_the_snapshot_takes_the_bus_figures_and_names_its_estimates() -> None:
    from trainbus.callbacks._bus_feed import BusFeed

    trainer = trainer_with(EventStream(), batches=5, callbacks=[Sleepy()])
    feed = BusFeed(trainer.engine)
    trainer.fit_sync()
    stats = feed.statistics()
    bus = {c.name: c for c in trainer.engine.statistics().callbacks}
    for row in stats["callbacks"]:
        real = bus[row["name"]]
        for field in ("handled", "inline", "total_time", "max_time", "slowest", "pending",
                      "peak_pending", "pending_records", "peak_pending_records", "on_thread",
                      "lag_batches", "barrier_wait_caused"):
            assert row[field] == getattr(real, field), (row["name"], field)
    assert stats["estimated"] == []  # every figure is counted by the bus


def test_the_recorder_stays_bounded_when_no_snapshot_is_taken() -> None:
    from trainbus.callbacks._bus_feed import BusFeed

    trainer = trainer_with(EventStream(), batches=300, callbacks=[Sleepy()])
    feed = BusFeed(trainer.engine, max_recorded=256)  # nobody takes snapshots
    trainer.fit_sync()
    assert trainer.engine.statistics().batches == 300  # > 1,000 spans were recorded
    assert len(list(feed.recorder.spans())) == 256
    assert feed.snapshot().timeline  # the newest spans are still there


def test_rate_coalesces_the_stream_into_at_most_n_messages_a_second() -> None:
    # Snapshots and outbox flushes every 10 ms: ~100 messages a second without ?rate.
    with Dashboard(snapshot_seconds=0.01) as dashboard:
        trainer = trainer_with(dashboard, batches=200, callbacks=[Sleepy()])
        messages: list[list[dict[str, Any]]] = []
        subscribed = threading.Event()
        window: list[float] = []

        def read() -> None:
            url = f"{dashboard.url}events?since=0&bus=1&pack=1&rate=5"
            window.append(time.monotonic())
            with httpx.Client(timeout=DEADLINE) as client, client.stream("GET", url) as r:
                subscribed.set()
                for line in r.iter_lines():
                    if line.startswith("data: ["):
                        messages.append(json.loads(line[6:]))
                    elif line == "event: end":
                        break
            window.append(time.monotonic())

        reader = threading.Thread(target=read)
        reader.start()
        assert subscribed.wait(DEADLINE)
        trainer.fit_sync()
        reader.join(DEADLINE)
    seqs = [item["seq"] for message in messages for item in message]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # every item, once, in order
    assert sum(i["type"] == "metrics" for m in messages for i in m) == 200
    # The stream was open for `seconds` (request to end, as the client saw it): at most 5
    # messages a second went out in that time (plus the first, sent at once).
    seconds = window[1] - window[0]
    assert len(messages) <= 1 + 5 * seconds + 1, (len(messages), seconds)


@pytest.mark.asyncio
async def test_a_page_that_opens_mid_run_replays_the_history_in_packs_encoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Opening the page replays the kept history. Encoding 20,000 items at once held the
    # GIL long enough to stall training for half a second: each item is now encoded once
    # (kept by the item, which every subscriber shares) and the replay goes out in packs.
    from tests.test_serve import plain_uvicorn

    n = 2500
    stream = EventStream(history=5000)
    for step in range(n):
        stream.publish(StreamMetrics({"loss": step / n}, step=step, wall_time=0.0))
    stream.end()
    encoded = 0
    to_dict = StreamMetrics.to_dict

    def counting(self: StreamMetrics) -> dict[str, Any]:
        nonlocal encoded
        encoded += 1
        return to_dict(self)

    monkeypatch.setattr(StreamMetrics, "to_dict", counting)

    async def end(sub: Any) -> dict[str, Any]:
        return {"status": "completed"}

    app = dashboard_app(stream, end, ConnectionHub())
    async with plain_uvicorn(app) as (_, base), httpx.AsyncClient(timeout=DEADLINE) as client:
        for page in ("first", "second"):
            url = f"{base}/events?since=0&pack=1&buffer=5000"
            lines = (await client.get(url)).text.splitlines()
            packs = [json.loads(line[6:]) for line in lines if line.startswith("data: [")]
            ids = [int(line[4:]) for line in lines if line.startswith("id: ")]
            assert [len(pack) for pack in packs] == [1000, 1000, 500], page
            assert [item["step"] for pack in packs for item in pack] == list(range(n))
            assert ids == [pack[-1]["seq"] for pack in packs]  # Last-Event-ID per pack
            assert encoded == n, page  # the second page encoded nothing again


def test_rate_is_checked() -> None:
    with Dashboard() as dashboard:
        for query, fix in (("pack=1&rate=0", "rate='0' must be messages per second"),
                           ("pack=1&rate=x", "rate='x' must be"),
                           ("rate=4", "needs pack=1")):
            response = httpx.get(f"{dashboard.url}events?{query}")
            assert response.status_code == 400
            assert fix in response.json()["error"]


def test_no_bus_snapshot_is_made_while_nobody_watches() -> None:
    with Dashboard(snapshot_seconds=0.01) as dashboard:
        trainer = trainer_with(dashboard, batches=100, callbacks=[Sleepy()])
        trainer.fit_sync()  # >= 0.2 s: twenty intervals
        snaps = [i for i in dashboard.stream._history if isinstance(i, StreamBusSnapshot)]
    assert len(snaps) == 1  # only the run's last one, for tabs that open later
    assert snaps[0].statistics["batches"] == 100
    by_name = {c["name"]: c for c in snaps[0].statistics["callbacks"]}
    assert by_name["Sleepy"]["barrier_wait_caused"] > 0  # estimates kept up meanwhile


def test_the_dashboard_trails_training_instead_of_holding_its_barrier() -> None:
    from trainbus import Event

    reached = threading.Event()

    class Reach(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) == 3:
                reached.set()

    class Stalled(Dashboard):
        """Its handler for batch 1 waits until training has reached batch 3."""

        released: bool | None = None

        def _send(self, item: Any) -> None:
            if (isinstance(item, StreamEvent) and item.event is Event.BATCH_END
                    and int(item.timestamp.batch) == 1):
                self.released = reached.wait(timeout=10)
            super()._send(item)

    with Stalled() as dashboard:
        trainer = trainer_with(dashboard, batches=6, callbacks=[Reach()])
        trainer.fit_sync()
    assert dashboard.released is True  # a lockstep handler would have held batch 1's barrier
    assert Stalled.trailing == 4


def test_no_dashboard_work_is_queued_per_batch_beyond_the_records() -> None:
    """The training thread queues nothing per batch for the Dashboard but the loss record
    (no ``BATCH_END`` snapshot, no second wake-up of its lane); the page still gets one
    ``batch_end`` per batch, in order, with the batch's counters."""
    batches = 40
    with Dashboard() as dashboard:
        trainer = trainer_with(dashboard, batches=batches)
        trainer.fit_sync()
        stats = {c.name: c for c in trainer.engine.statistics().callbacks}
        ends = [i for i in dashboard.stream._history
                if isinstance(i, StreamEvent) and i.event.value == "batch_end"]
    # Its calls: one record per batch, plus a handful of run and epoch events.
    assert batches <= stats["Dashboard"].handled <= batches + 8
    assert [int(e.timestamp.batch) for e in ends] == list(range(1, batches + 1))
    assert all(int(e.timestamp.epoch) == 0 for e in ends)
    assert all(b.wall_time >= a.wall_time for a, b in itertools.pairwise(ends))


def test_batch_end_items_follow_the_runs_own_batch_records_without_loss_logging() -> None:
    """With ``log_train_loss=False`` the page's batch counter follows what the run logs."""

    class Accuracy(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            if int(state.timer.batch) % 5 == 0:
                logger.log_metrics({"acc": 0.5})

    model = TinyModel()
    with Dashboard() as dashboard:
        trainer = Trainer(model, make_loader(20), "1ep",
                          optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                          callbacks=[Accuracy()], loggers=[dashboard], log_train_loss=False)
        trainer.fit_sync()
        ends = [int(i.timestamp.batch) for i in dashboard.stream._history
                if isinstance(i, StreamEvent) and i.event.value == "batch_end"]
    assert ends == [5, 10, 15, 20]


def test_a_snapshot_says_which_batch_of_the_run_it_is_from_also_in_a_resumed_run(
    tmp_path: Path,
) -> None:
    """Regression: the callbacks panel showed the bus's own batch count ("3 batches") next
    to a header at batch 6: a resumed (or continued) run's bus counts only its own batches.
    The snapshot now carries the run's timer, as the header does."""
    from trainbus.callbacks import CheckpointSaver

    def trainer(dashboard: Dashboard | None, duration: str, **kw: Any) -> Trainer:
        model = TinyModel()
        return Trainer(model, make_loader(3), duration,
                       optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                       loggers=[dashboard] if dashboard else [], device="cpu", **kw)

    first = trainer(None, "1ep", callbacks=[CheckpointSaver(tmp_path, save_interval="1ep")])
    first.fit_sync()
    with Dashboard() as dashboard:
        resumed = trainer(dashboard, "2ep", load_path=tmp_path)
        resumed.fit_sync()
        snaps = [i for i in dashboard.stream._history if isinstance(i, StreamBusSnapshot)]
    last = snaps[-1].statistics
    assert (last["batch"], last["epoch"]) == (6, 2)  # the run's own position
    assert last["batches"] == 3  # what this engine published


def test_private_helper_callbacks_are_not_listed_as_the_users(tmp_path: Path) -> None:
    """Regression: the demo's internal ``_TrainingClock`` showed in the callbacks panel and
    the timeline as if the user had added it."""
    from trainbus._demo import run_demo

    with Dashboard() as dashboard, (tmp_path / "out.txt").open("w") as out:
        run_demo(epochs=1, out=tmp_path, upload_latency_ms=1, dashboard=dashboard, stream=out)
        snaps = [i for i in dashboard.stream._history if isinstance(i, StreamBusSnapshot)]
    names = {c["name"] for c in snaps[-1].statistics["callbacks"]}
    assert {"SpeedMonitor", "LRMonitor", "SimulatedUploader", "Dashboard"} <= names
    assert not any(name.startswith("_") for name in names)
    assert not any(span["row"].startswith("_") for s in snaps for span in s.timeline)
