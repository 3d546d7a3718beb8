"""The ```python examples of docs/service.md run: the EventStream example as printed, the
httpx client against the service, and the job factory of ``examples/service/app.py`` (its
page excerpt, with its imports, builds a trainer that fits).

The page's other ```python blocks are the files of ``examples/service/`` (``tests/test_serve.py``
runs them and checks that the page shows them verbatim); the aiohttp sketch, which serves
until Ctrl-C and needs aiohttp, is fenced ``python-outline``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_pages import BLOCK, DOCS

DOC = DOCS / "service.md"


def test_the_event_stream_example_runs_as_printed_and_prints_what_the_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: the example used ``model``, ``loader`` and ``send`` without defining them,
    and ``async with`` at the top level of a script."""
    monkeypatch.chdir(tmp_path)
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## EventStream") :]
    code = BLOCK.findall(section)[0]
    exec(compile(code, f"{DOC.name}[EventStream #0]", "exec"), {"__name__": "__main__"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "StreamEvent(init, epoch=0, batch=0)",
        "StreamEvent(fit_start, epoch=0, batch=0)",
        "StreamEvent(epoch_start, epoch=0, batch=0)",
    ]
    assert "StreamEvent(batch_end, epoch=0, batch=3)" in lines
    assert re.fullmatch(r"StreamMetrics\(step=3, loss/train=[\d.]+\)", lines[lines.index(
        "StreamEvent(batch_end, epoch=0, batch=3)") - 1])
    assert lines[-2:] == ["StreamEvent(fit_end, epoch=2, batch=8)", "23 items sent"]
    for shown in ("`StreamEvent(init, epoch=0, batch=0)`", "`StreamEvent(batch_end, epoch=0, "
                  "batch=3)`", "`StreamEvent(fit_end, epoch=2, batch=8)`", "`23 items sent`"):
        assert shown in section  # the page says what the code prints
    assert "# StreamEvent(batch_end, epoch=0, batch=3)" in code


@pytest.mark.parametrize("token", [None, "a-token-for-the-docs-example"])
def test_the_httpx_client_example_runs_against_the_service(
    token: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's own client, against the real demo service (with and without a token)."""
    import asyncio
    import threading

    from trainbus.serve import create_app, create_server

    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("**Beyond loopback.**") :]
    code = BLOCK.findall(section)[0]
    assert "prints `completed`" in section
    server = create_server(create_app(token=token), port=0)
    started = threading.Event()
    original = server.startup

    async def startup(sockets: object = None) -> None:
        await original(sockets=sockets)  # type: ignore[arg-type]
        started.set()

    server.startup = startup  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        assert started.wait(timeout=30)
        line = 'url, token = "http://127.0.0.1:8000", None'
        assert line in code
        code = code.replace(line, f"url, token = {f'http://127.0.0.1:{server.port}'!r}, {token!r}")
        exec(compile(code, f"{DOC.name}[httpx client]", "exec"), {"__name__": "__main__"})
        assert capsys.readouterr().out == "completed\n"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_the_job_factory_excerpt_runs_with_its_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the excerpt used ``JobContext`` and ``trainbus`` without importing them."""
    from trainbus.callbacks import EventStream
    from trainbus.serve import JobContext

    monkeypatch.chdir(tmp_path)
    text = DOC.read_text(encoding="utf-8")
    (code,) = [block for block in BLOCK.findall(text) if "def regression_job" in block]
    namespace: dict[str, object] = {"__name__": "docs_service_factory"}
    exec(compile(code, f"{DOC.name}[regression_job]", "exec"), namespace)
    stream = EventStream()
    ctx = JobContext("job-1", {"epochs": 1, "batches": 2}, stream)
    trainer = namespace["regression_job"](ctx)  # type: ignore[operator]
    trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 2
