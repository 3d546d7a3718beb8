"""The dashboard in real headless Chromium (Debian's ``chromium``), driven by Playwright.

CI installs ``chromium`` (``.ci/run``) and ``playwright`` (the ``test`` extra); without
them these tests FAIL with a message saying what to install, they do not skip. One
browser is shared by the whole module; each test opens its own page.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer
from trainbus.callbacks import Dashboard
from trainbus.serve import JobContext, create_app, create_server

CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")
WAIT_MS = 30_000
REBOUND = "rebind.test"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: `apt-get install -y chromium` "
            "(Debian), or set TRAINBUS_CHROMIUM to a Chromium binary"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]' (no browsers "
                    "download needed: they use the system Chromium)")
    with sync_playwright() as p:
        # rebind.test resolves to 127.0.0.1, as a rebinding attacker's domain would.
        args = ["--no-sandbox", f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=args)
        try:
            yield chromium
        finally:
            chromium.close()


class Watched:
    """A page plus every console error and uncaught exception it produced."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.page.on(
            "console", lambda m: self.errors.append(m.text) if m.type == "error" else None
        )
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    def state(self, expr: str) -> Any:
        return self.page.evaluate(f"window.trainbusDashboard.{expr}")

    def wait(self, condition: str) -> None:
        self.page.wait_for_function(f"(D => {condition})(window.trainbusDashboard)",
                                    timeout=WAIT_MS)


class Hold(Callback):
    """Holds training at the end of batch ``at`` until :attr:`go` is set (a plain handler)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = threading.Event()
        self.go = threading.Event()

    def batch_end(self, state: Any, logger: Any) -> None:
        if int(state.timer.batch) == self.at:
            self.reached.set()
            self.go.wait(timeout=60)


class SlowPoke(Callback):
    """Deliberately slow: 4 ms of blocking work per batch."""

    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.004)


class Quick(Callback):
    async def batch_end(self, state: Any, logger: Any) -> None:
        pass


def local_run(batches: int, callbacks: list[Callback], dashboard: Dashboard) -> Trainer:
    model = TinyModel()
    trainer = Trainer(model, make_loader(batches), "1ep",
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      callbacks=callbacks, loggers=[dashboard])
    return trainer


def in_thread(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, name="test-fit", daemon=True)
    thread.start()
    return thread


def test_job_page_loads_cleanly_and_its_loss_curve_grows_while_the_job_trains(
    browser: Any,
) -> None:
    hold = Hold(at=10)

    def factory(ctx: JobContext) -> Trainer:
        model = TinyModel()
        return Trainer(model, make_loader(40), "1ep",
                       optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                       callbacks=[hold], loggers=ctx.loggers)

    app = create_app(factory)
    server = create_server(app, port=0)
    ready = threading.Event()
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        ready.set()

    server.startup = startup  # type: ignore[method-assign]
    serving = in_thread(lambda: asyncio.run(server.serve()))
    try:
        assert ready.wait(timeout=30)
        base = f"http://127.0.0.1:{server.port}"
        import httpx

        job = httpx.post(f"{base}/jobs", json={}).json()
        watched = Watched(browser)
        watched.page.goto(f"{base}/jobs/{job['id']}/dashboard")
        assert hold.reached.wait(timeout=30)
        watched.wait("D.loss.count >= 10")
        # Training is held at batch 10: the page is live and has the points so far.
        assert watched.state("status") == "live"
        assert watched.state("loss.count") == 10
        assert httpx.get(f"{base}/jobs/{job['id']}").json()["status"] == "running"
        hold.go.set()
        watched.wait("D.ended !== null")
        assert watched.state("loss.count") == 40  # it gained the rest while the job trained
        assert watched.state("loss.steps") == list(range(1, 41))
        assert watched.state("status") == "finished"
        watched.wait("D.bus !== null && D.bus.statistics.batches === 40")
        assert watched.page.locator("#callbacks tbody tr").count() >= 1
        assert watched.errors == []
    finally:
        hold.go.set()
        server.should_exit = True
        serving.join(timeout=30)


def test_callbacks_panel_names_the_slow_callback_as_the_slowest(browser: Any) -> None:
    with Dashboard(snapshot_seconds=0.1) as dashboard:
        trainer = local_run(60, [Quick(), SlowPoke()], dashboard)
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        fit = in_thread(trainer.fit_sync)
        watched.wait("D.ended !== null && D.bus !== null && D.bus.statistics.batches === 60")
        fit.join(timeout=30)
        assert watched.state("slowest") == "SlowPoke"
        assert watched.page.text_content("#slowest") == "SlowPoke"
        first_row = watched.page.locator("#callbacks tbody tr").first
        assert first_row.get_attribute("data-callback") == "SlowPoke"
        assert "slowest" in (first_row.get_attribute("class") or "")
        rows = watched.state("bus.statistics.callbacks.map(c => c.name)")
        assert set(rows) >= {"Quick", "SlowPoke", "Dashboard"}
        timeline_rows = watched.state("bus.timeline.map(s => s.row)")
        assert "training thread" in timeline_rows and "SlowPoke" in timeline_rows
        assert watched.errors == []


def test_a_restarted_server_resumes_the_stream_without_duplicates(browser: Any) -> None:
    hold = Hold(at=15)
    dashboard = Dashboard()
    try:
        trainer = local_run(50, [hold], dashboard)
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        fit = in_thread(trainer.fit_sync)
        assert hold.reached.wait(timeout=30)
        watched.wait("D.loss.count >= 15")
        port = dashboard.port
        dashboard.stop()  # the server goes away; the page's EventSource retries
        watched.wait("D.status === 'reconnecting'")
        dashboard.start()
        assert dashboard.port == port
        hold.go.set()
        watched.wait("D.ended !== null")
        fit.join(timeout=30)
        assert watched.state("reconnects") >= 1
        assert watched.state("duplicates") == 0
        assert watched.state("loss.steps") == list(range(1, 51))  # none twice, none missing
        assert watched.state("status") == "finished"
        assert watched.errors == [] or all("ERR_CONNECTION_REFUSED" in e for e in watched.errors)
    finally:
        hold.go.set()
        dashboard.stop()


def test_demo_page_at_the_end_of_the_run(browser: Any, tmp_path: Path) -> None:
    from trainbus._demo import run_demo

    with Dashboard() as dashboard:
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        results: list[Any] = []
        with open(os.devnull, "w") as quiet:
            # Playwright's sync API runs a loop on this thread: the demo trains on another.
            in_thread(lambda: results.append(run_demo(
                epochs=2, out=tmp_path, upload_latency_ms=5, dashboard=dashboard, stream=quiet
            ))).join(timeout=60)
        result = results[0]
        watched.wait("D.ended !== null && D.evals.x.length === 2")
        assert watched.state("status") == "finished"
        assert watched.state("loss.count") > 0
        assert watched.state("evals.names").count("eval/accuracy") == 1
        assert abs(watched.state("evals.ys['eval/accuracy'][1]") - result.accuracy) < 1e-6
        shot = tmp_path / "dashboard.png"
        watched.page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        # The demo's private helper (_TrainingClock) is not listed as the user's callback.
        listed = watched.page.eval_on_selector_all(
            "#callbacks tbody tr", "rows => rows.map(r => r.dataset.callback)")
        assert {"SpeedMonitor", "LRMonitor", "SimulatedUploader", "Dashboard"} <= set(listed)
        assert [name for name in listed if name.startswith("_")] == []
        assert watched.errors == []


CANVAS_COLOURS = """() => {
    const canvas = document.getElementById("timeline");
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    const counts = {};
    for (let i = 0; i < data.length; i += 4) {
        const hex = "#" + [data[i], data[i + 1], data[i + 2]]
            .map((v) => v.toString(16).padStart(2, "0")).join("");
        counts[hex] = (counts[hex] || 0) + 1;
    }
    return counts;
}"""


def test_the_timeline_has_a_legend_for_each_colour_it_draws(browser: Any) -> None:
    """Regression: the timeline's three colours (a batch, a wait, a handler) had no legend."""
    hold = Hold(at=20)
    with Dashboard(snapshot_seconds=0.05) as dashboard:
        trainer = local_run(40, [hold, SlowPoke()], dashboard)
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        fit = in_thread(trainer.fit_sync)
        try:
            assert hold.reached.wait(timeout=30)  # held in a barrier wait at batch 20
            watched.wait("D.bus !== null && D.bus.timeline.some(s => s.label.startsWith('wait'))")
        finally:
            hold.go.set()
        watched.wait("D.ended !== null")
        fit.join(timeout=30)
        watched.page.wait_for_timeout(300)  # the last frame
        legend = watched.page.eval_on_selector_all(
            "#timeline-legend .legend-item",
            "items => items.map(i => [i.dataset.kind, i.textContent,"
            " getComputedStyle(i.querySelector('.swatch')).backgroundColor])")
        assert [kind for kind, _, _ in legend] == ["batch", "wait", "handler"]
        texts = {kind: text for kind, text, _ in legend}
        assert "computing a batch" in texts["batch"]
        assert "waiting for callbacks" in texts["wait"]
        assert "handler" in texts["handler"]
        # Each legend swatch has the colour the canvas uses for that kind, and is drawn.
        drawn = watched.page.evaluate(CANVAS_COLOURS)
        for kind, _, rgb in legend:
            colour = next(k["color"] for k in watched.state("timelineLegend") if k["key"] == kind)
            r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
            assert rgb == f"rgb({r}, {g}, {b})"
            if kind != "wait":  # the last batches' timeline may hold no wait any more
                assert drawn.get(colour, 0) > 20, (kind, colour)
        assert watched.errors == []


def test_the_callbacks_panel_says_the_batch_its_figures_are_from_as_the_header_does(
    browser: Any, tmp_path: Path,
) -> None:
    """Regression: the panel said "3 batches" (the bus's own count, stale or of a resumed
    run) while the header said batch 6. It now says which batch of the run its figures are
    from: the header's batch while training is held, and the last batch at the end."""
    from trainbus.callbacks import CheckpointSaver

    saved = TinyModel()
    first = Trainer(saved, make_loader(3), "1ep",
                    optimizers=torch.optim.SGD(saved.parameters(), lr=0.1),
                    callbacks=[CheckpointSaver(tmp_path, save_interval="1ep")])
    in_thread(first.fit_sync).join(timeout=60)  # batches 1-3: the resumed run starts at 4
    assert list(tmp_path.glob("*.pt"))
    hold = Hold(at=6)
    with Dashboard(snapshot_seconds=0.05) as dashboard:
        model = TinyModel()
        trainer = Trainer(model, make_loader(3), "3ep",
                          optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                          callbacks=[hold], loggers=[dashboard], load_path=tmp_path)
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        fit = in_thread(trainer.fit_sync)
        try:
            assert hold.reached.wait(timeout=30)
            watched.page.wait_for_function(
                "document.getElementById('batch').textContent === '6' && "
                "document.getElementById('bus-as-of').textContent === 'as of batch 6'",
                timeout=WAIT_MS)
            assert watched.page.text_content("#bus-summary").startswith("As of batch 6:")
        finally:
            hold.go.set()
        watched.wait("D.ended !== null")
        fit.join(timeout=30)
        watched.page.wait_for_timeout(300)  # the last frame
        assert watched.page.text_content("#batch") == "9"
        assert watched.page.text_content("#bus-as-of") == "as of batch 9"
        assert watched.state("bus.statistics.batches") == 6  # this bus's own: batches 4-9
        assert watched.errors == []


def test_the_page_draws_at_most_four_frames_a_second_and_keeps_its_table_rows(
    browser: Any,
) -> None:
    with Dashboard(snapshot_seconds=0.05) as dashboard:
        trainer = local_run(300, [Quick(), SlowPoke()], dashboard)
        watched = Watched(browser)
        watched.page.goto(dashboard.url)
        watched.wait("D.status === 'live'")
        # Every <tr> ever put into the callbacks table, counted once.
        watched.page.evaluate("""() => {
            const seen = new Set();
            window.rowsCreated = 0;
            new MutationObserver((records) => {
                for (const r of records) for (const n of r.addedNodes)
                    if (!seen.has(n)) { seen.add(n); window.rowsCreated += 1; }
            }).observe(document.querySelector('#callbacks tbody'), {childList: true});
        }""")
        fit = in_thread(trainer.fit_sync)
        watched.wait("D.ended !== null && D.bus !== null && D.bus.statistics.batches === 300")
        fit.join(timeout=30)
        watched.page.wait_for_timeout(300)  # the last frame
        assert watched.page.evaluate("window.rowsCreated") == 3  # Quick, SlowPoke, Dashboard
        assert watched.page.locator("#callbacks tbody tr").count() == 3
        frames, first, last, messages, received = watched.page.evaluate(
            "[D => [D.frames, D.firstFrameAt, D.lastFrameAt, D.messages, D.received]]"
            "[0](window.trainbusDashboard)")
        assert frames >= 2 and received > 600  # ~2 items a batch
        assert frames - 1 <= (last - first) / 250  # frames at least 250 ms apart
        assert messages < received / 10  # the server packs the items (?pack=1&rate=4)
        assert watched.errors == []


# -- who can open it (issue 46) -------------------------------------------------------------


def test_a_token_protected_page_loads_and_streams_with_its_cookie(browser: Any) -> None:
    token = "browser-test-token-0123456789"
    with Dashboard(token=token) as dashboard:
        trainer = local_run(30, [Quick()], dashboard)
        watched = Watched(browser)
        assert dashboard.url.endswith(f"?token={token}")
        watched.page.goto(dashboard.url)  # the cookie carries the token to scripts and /events
        fit = in_thread(trainer.fit_sync)
        watched.wait("D.ended !== null")
        fit.join(timeout=30)
        assert watched.state("loss.steps") == list(range(1, 31))
        assert watched.state("status") == "finished"
        assert watched.errors == []
        other = browser.new_page()  # a fresh browser without the cookie: refused
        try:
            response = other.goto(dashboard.url.split("?")[0])
            assert response is not None and response.status == 401
        finally:
            other.close()


def test_a_rebound_name_and_a_cross_site_page_start_no_job(browser: Any) -> None:
    started: list[str] = []

    def factory(ctx: JobContext) -> Trainer:
        started.append(ctx.job_id)
        model = TinyModel()
        return Trainer(model, make_loader(4), "1ep",
                       optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                       loggers=ctx.loggers)

    server = create_server(create_app(factory), port=0)
    ready = threading.Event()
    original = server.startup

    async def startup(sockets: Any = None) -> None:
        await original(sockets=sockets)
        ready.set()

    server.startup = startup  # type: ignore[method-assign]
    serving = in_thread(lambda: asyncio.run(server.serve()))
    try:
        assert ready.wait(timeout=30)
        port = server.port
        page = browser.new_page()
        posts: list[int] = []
        page.on("response", lambda r: posts.append(r.status)
                if r.request.method == "POST" else None)  # fmt: skip
        # DNS rebinding: the attacker's name, resolved to 127.0.0.1, is refused.
        response = page.goto(f"http://{REBOUND}:{port}/jobs")
        assert response is not None and response.status == 403
        # From that page (another site than 127.0.0.1): a same-origin JSON POST to its own
        # name, a cross-site text/plain fetch, and a cross-site form post.
        status = page.evaluate("""async (port) => {
            const own = await fetch("/jobs", {method: "POST", body: "{}",
                                              headers: {"Content-Type": "application/json"}});
            await fetch(`http://127.0.0.1:${port}/jobs`, {method: "POST", mode: "no-cors",
                        headers: {"Content-Type": "text/plain"}, body: '{"batches": 1}'});
            const frame = document.createElement("iframe");
            frame.name = "sink";
            document.body.appendChild(frame);
            const form = document.createElement("form");
            Object.assign(form, {method: "POST", action: `http://127.0.0.1:${port}/jobs`,
                                 target: "sink", enctype: "text/plain"});
            const field = document.createElement("input");
            Object.assign(field, {name: '{"batches": 1, "x": "', value: '"}'});
            form.appendChild(field);
            document.body.appendChild(form);
            const loaded = new Promise(resolve => frame.addEventListener("load", resolve));
            form.submit();
            await loaded;
            return own.status;
        }""", port)
        assert status == 403
        assert len(posts) == 3 and all(s in (403, 415) for s in posts), posts
        import httpx

        assert httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=30).json() == []
        assert started == []
        # The normal client still works.
        r = httpx.post(f"http://127.0.0.1:{port}/jobs", json={}, timeout=30)
        assert r.status_code == 201
        page.close()
    finally:
        server.should_exit = True
        serving.join(timeout=30)
