"""``trainbus report``'s page in real headless Chromium (Debian's ``chromium``, driven by
Playwright, as tests/test_dashboard_browser.py): it renders without an error and without
the network, each curve holds every logged point, the account has a bar per epoch, and the
batch a run resumed from is marked."""

from __future__ import annotations

import io
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_trainer
from tests.test_dashboard_browser import CHROMIUM
from tests.test_time_account import Killer
from trainbus.__main__ import main
from trainbus.callbacks import CheckpointSaver
from trainbus.loggers import JSONLinesLogger


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: `apt-get install -y chromium` "
            "(Debian), or set TRAINBUS_CHROMIUM to a Chromium binary"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install -e '.[test]'")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium.new_page(viewport={"width": 1100, "height": 900})
        finally:
            chromium.close()


def open_report(page: Any, path: Path) -> list[str]:
    """Open the page offline; return the console errors and every request it made."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: seen.append(str(exc)))
    page.on("request", lambda r: None if r.url.startswith("file:") else seen.append(r.url))
    page.goto(path.resolve().as_uri())
    return seen


def open_report_url(page: Any, url: str) -> list[str]:
    """Open ``url``; return the console errors it produced."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: seen.append(str(exc)))
    page.goto(url)
    return seen


def off_this_thread(fn: Any) -> None:
    """Run ``fn`` on another thread (Playwright's sync API runs a loop on this one, and
    ``fit_sync()`` refuses a thread with a loop); re-raise its exception here."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="test-fit", daemon=True)
    thread.start()
    thread.join(timeout=120)
    if failed:
        raise failed[0]


def logged_points(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        point = json.loads(line)
        if point["kind"] == "metric" and not point["name"].startswith("time/"):
            counts[point["name"]] += 1
    return counts


def curves(page: Any) -> dict[str, tuple[int, int]]:
    """Per chart: its data-points and the vertices its polyline draws."""
    found = page.eval_on_selector_all(
        "svg.chart",
        """svgs => svgs.map(s => {
            const line = s.querySelector('polyline.curve');
            return [s.dataset.metric, Number(line.dataset.points),
                    line.points.numberOfItems];
        })""",
    )
    return {name: (n, drawn) for name, n, drawn in found}


@pytest.mark.slow  # the demo's run: about 10 s on a loaded 2-core machine
def test_the_demos_report_renders_with_every_logged_point(
    page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainbus._demo import run_demo

    monkeypatch.setenv("TRAINBUS_PROGRESS", "1")  # the default: the account is logged
    off_this_thread(
        lambda: run_demo(epochs=2, out=tmp_path, upload_latency_ms=5, stream=io.StringIO())
    )
    assert main(["report", str(tmp_path)]) == 0
    report = tmp_path / "report.html"
    assert open_report(page, report) == []
    drawn = curves(page)
    expected = logged_points(tmp_path / "metrics.jsonl")
    assert {"loss/train", "eval/accuracy"} <= expected.keys()
    assert drawn == {name: (n, n) for name, n in expected.items()}
    assert page.locator("#epochs rect.part[data-part=compute]").count() == 2  # 2 epochs
    listed = page.eval_on_selector_all(
        "#callbacks tr td:first-child", "cells => cells.map(c => c.textContent)"
    )
    assert {"SpeedMonitor", "SimulatedUploader", "JSONLinesLogger"} <= set(listed)
    assert page.locator("#account").inner_text().count("compute") == 1
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_a_resumed_runs_report_marks_the_resume(page: Any, tmp_path: Path) -> None:
    folder, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"

    def fit(callbacks: list[Any], **kw: Any) -> None:
        make_trainer(
            12, callbacks=[CheckpointSaver(folder, save_interval="4ba"), *callbacks],
            loggers=[JSONLinesLogger(metrics)], progress=True, **kw,
        ).fit_sync()

    with pytest.raises(RuntimeError, match="killed"):
        off_this_thread(lambda: fit([Killer(at=7)]))
    off_this_thread(lambda: fit([], load_path=folder))
    assert main(["report", str(metrics), "--out", str(tmp_path / "r.html")]) == 0
    assert open_report(page, tmp_path / "r.html") == []
    marks = page.eval_on_selector_all(
        "svg.chart[data-metric='loss/train'] line.resume", "ls => ls.map(l => l.dataset.step)"
    )
    assert marks == ["4"]
    # Each step once (the resumed run's replayed points were not written twice).
    assert curves(page)["loss/train"] == (12, 12)


def test_the_dashboard_shows_the_account(page: Any) -> None:
    from trainbus.callbacks import Dashboard

    with Dashboard() as dashboard:
        off_this_thread(lambda: make_trainer(
            6, epochs=2, loggers=[dashboard], progress=True
        ).fit_sync())
        errors = open_report_url(page, dashboard.url)
        page.wait_for_function("window.trainbusDashboard.account.step === 12", timeout=30_000)
        page.wait_for_function(
            "document.getElementById('account').textContent.includes('compute')",
            timeout=30_000,
        )
        assert "s to batch 12: " in page.locator("#account").inner_text()
        assert errors == []
