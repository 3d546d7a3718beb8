"""The ```python examples of docs/porting-from-composer.md run, against a real HTTP server.

The whole page runs top to bottom in one namespace and one folder, as a reader runs it
(``Page.run_all``); the other tests run the setup (the blocks before the first ``## ``
heading) and one section's blocks to look at what that section built. The upload example
posts to a local ``http.server`` on 127.0.0.1 (port 0) named by ``UPLOAD_URL``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.docs_pages import Page
from trainbus import Callback, Event, Logger, LogLevel, State, blocking
from trainbus.core.callback import resolve_callback

PAGE = Page.read("porting-from-composer.md")
DOC = PAGE.path
UPLOAD_SECTION = "Making an upload overlap with training"
DESTINATIONS_SECTION = "Logger destinations"
DESTINATIONS_OUTPUT = "porting-demo 4\n[1, 2, 3, 4, 5, 6, 7, 8]\n[1, 2, 3, 4, 1, 2, 3, 4]\n"


SETUP, SECTIONS = PAGE.setup, PAGE.sections


def run_section(title: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"docs_porting_{title}"}
    PAGE.run(title, namespace)
    return namespace


class ProgressServer:
    """Collects JSON posts; can hold its first reply until ``release`` is set."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.hold_first = False
        self.release = threading.Event()
        self.released_in_time: list[bool] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = json.loads(self.rfile.read(length))
                first = not outer.bodies
                outer.bodies.append(body)
                status = 200
                if first and outer.hold_first:
                    released = outer.release.wait(30.0)
                    outer.released_in_time.append(released)
                    status = 200 if released else 503
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/progress"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,))

    def __enter__(self) -> ProgressServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProgressServer]:
    with ProgressServer() as srv:
        monkeypatch.setenv("UPLOAD_URL", srv.url)
        yield srv


def test_the_page_runs_top_to_bottom_in_one_folder(
    server: ProgressServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As a reader runs it: every block in order, one namespace, one folder."""
    monkeypatch.chdir(tmp_path)
    printed = PAGE.run_all_printing(capsys)
    assert printed["Change the imports"] == "8 BATCH 8\n"
    assert printed[UPLOAD_SECTION] == "2\n"
    assert printed[DESTINATIONS_SECTION] == DESTINATIONS_OUTPUT
    assert [(b["epoch"], b["samples"]) for b in server.bodies] == [(1, 16), (2, 16)]


def test_the_page_has_examples() -> None:
    assert SETUP
    assert {"Change the imports", UPLOAD_SECTION, DESTINATIONS_SECTION} <= set(SECTIONS)


def test_the_table_names_every_composer_concept() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in [
        "Callback",
        "run_event",
        "close",
        "post_close",
        "Event.INIT",
        "State.model",
        "State.optimizers",
        "State.timer",
        "get_elapsed_duration",
        "current_metrics",
        "Logger.data",
        "data_fit",
        "data_epoch",
        "data_batch",
        "LogLevel",
        "LoggerDestination",
        "Engine.run_event",
        "Trainer(",
        "Algorithm",
        "profiler",
        "InMemoryLogger",
        "Time",
        "Timer",
        "barrier",
        "max_lag",
        "snapshot",
        "async def",
        "@blocking",
        "log_data",
        "Logger.run_name",
        "State.steps_per_epoch",
        "_fields",
        "file_artifact",
        "FitNotAwaitedWarning",
        "CheckpointSaveError",
    ]:
        assert name in text, name


def test_change_the_imports_example(capsys: pytest.CaptureFixture[str]) -> None:
    namespace = run_section("Change the imports")
    assert capsys.readouterr().out == "8 BATCH 8\n"
    in_memory = namespace["in_memory"]
    lrs = [value for _, _, value in in_memory.data["lr/group0"]]
    assert lrs == [0.1] * 8
    assert [v for _, _, v in in_memory.data["epochs_done"]] == [1, 2]


def test_upload_example_posts_every_epoch(
    server: ProgressServer, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = run_section(UPLOAD_SECTION)
    assert namespace["UPLOAD_URL"] == server.url
    assert capsys.readouterr().out == "2\n"
    assert [(b["epoch"], b["samples"]) for b in server.bodies] == [(1, 16), (2, 16)]
    assert all(isinstance(b["recent_loss"], float) for b in server.bodies)
    uploaded = resolve_callback(namespace["uploader"]).handlers[Event.EPOCH_END]
    assert uploaded.is_async


class OpenAtSecondEpoch(Callback):
    """Opens the gate when training reaches the first batch of epoch 2 (in lockstep)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    @blocking
    def batch_start(self, state: State, logger: Logger) -> None:
        if int(state.timer.epoch) == 1:
            self.gate.set()


def test_the_async_upload_overlaps_with_training(server: ProgressServer) -> None:
    """The first POST is answered only once training has started epoch 2.

    If the upload held the training thread (as in Composer), epoch 2 would never start
    while the request is open: the server would give up after 30 s and answer 503.
    """
    namespace = run_section(UPLOAD_SECTION)
    server.bodies.clear()
    server.hold_first = True
    uploader = namespace["ProgressUploader"](server.url)
    trainer = namespace["make_trainer"](
        callbacks=[uploader, OpenAtSecondEpoch(server.release)]
    )
    trainer.fit_sync()
    assert server.released_in_time == [True]
    assert uploader.uploads == 2
    assert [b["epoch"] for b in server.bodies] == [1, 2]


def test_the_composer_style_destination_gets_every_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = run_section(DESTINATIONS_SECTION)
    assert capsys.readouterr().out == DESTINATIONS_OUTPUT
    points = namespace["timeseries"].points
    assert [(int(ts.batch), level) for ts, level, _ in points] == [
        (b, LogLevel.BATCH) for b in range(1, 9)
    ]
    assert all(set(data) == {"loss/train"} for _, _, data in points)
