"""Who can reach the service and the dashboard (issue 46): the real servers on 127.0.0.1.

A web page the user visits can send a cross-site "simple" request (``text/plain`` or a
form, no preflight) and, by DNS rebinding, requests whose ``Host`` is its own domain. Both
servers refuse them; the normal clients (httpx with ``json=``, the dashboard page) work;
a token, when set, is required. The browser's side is in ``tests/test_dashboard_browser.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest

from tests.helpers import make_trainer
from tests.test_serve import DEADLINE, Factory, serving
from trainbus.callbacks import Dashboard
from trainbus.serve import create_app, create_server

TOKEN = "s3cret-token-for-the-tests"
EVIL = "http://evil.example"


def cross_site_requests(url: str) -> list[tuple[str, dict[str, Any]]]:
    """What a page on another site can make a browser send to ``POST /jobs`` (and more)."""
    host = url.removeprefix("http://")
    return [
        ("text/plain", {"content": b'{"batches": 1}', "headers": {
            "Content-Type": "text/plain;charset=UTF-8", "Origin": EVIL}}),
        ("form", {"content": b"batches=1", "headers": {
            "Content-Type": "application/x-www-form-urlencoded", "Origin": EVIL}}),
        ("multipart", {"content": b"--x\r\n\r\n--x--", "headers": {
            "Content-Type": "multipart/form-data; boundary=x", "Origin": EVIL}}),
        ("no body", {"headers": {"Origin": EVIL}}),
        ("JSON from another origin", {"json": {"batches": 1}, "headers": {"Origin": EVIL}}),
        ("Origin null (a sandboxed frame)", {"json": {}, "headers": {"Origin": "null"}}),
        ("rebinding", {"json": {"batches": 1}, "headers": {"Host": f"evil.example:{url[-5:]}"}}),
        ("rebinding, same-origin", {"json": {}, "headers": {
            "Host": "evil.example", "Origin": EVIL}}),
        ("text/plain, no Origin (curl -d)", {"content": b"{}", "headers": {
            "Content-Type": "text/plain", "Host": host}}),
    ]


@pytest.mark.asyncio
async def test_cross_site_posts_and_a_foreign_host_are_refused_and_start_no_job() -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory)) as (_, url), httpx.AsyncClient(base_url=url) as c:
            for what, kwargs in cross_site_requests(url):
                r = await c.post("/jobs", **kwargs)
                assert r.status_code in (403, 415), (what, r.status_code, r.text)
                assert "error" in r.json(), what
            assert (await c.get("/jobs")).json() == []
            assert factory.recorders == {}  # the factory was never called: no job started

            # The messages name the fix.
            r = await c.post("/jobs", content=b"{}", headers={"Content-Type": "text/plain"})
            assert r.status_code == 415 and "application/json" in r.json()["error"]
            r = await c.post("/jobs", json={}, headers={"Origin": EVIL})
            assert r.status_code == 403 and "another site" in r.json()["error"]
            r = await c.get("/jobs", headers={"Host": "evil.example"})
            assert r.status_code == 403 and "allowed_hosts" in r.json()["error"]


@pytest.mark.asyncio
async def test_a_foreign_host_reads_nothing_and_cancels_nothing() -> None:
    """DNS rebinding: the job list, a job, its stream, its page and DELETE all refuse."""
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory)) as (_, url), httpx.AsyncClient(base_url=url) as c:
            job = (await c.post("/jobs", json={"batches": 1_000_000})).json()["id"]
            port = url.rsplit(":", 1)[1]
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example",
                         f"localhost.evil.example:{port}", "", "[::1"):
                for method, path in (("GET", "/jobs"), ("GET", f"/jobs/{job}"),
                                     ("GET", f"/jobs/{job}/events?since=0"),
                                     ("GET", f"/jobs/{job}/dashboard"),
                                     ("GET", "/static/dashboard.js"), ("GET", "/healthz"),
                                     ("DELETE", f"/jobs/{job}")):  # fmt: skip
                    r = await c.request(method, path, headers={"Host": host})
                    assert r.status_code == 403, (host, method, path, r.status_code)
                    assert "DNS rebinding" in r.json()["error"]
            assert (await c.get(f"/jobs/{job}")).json()["status"] == "running"  # not cancelled
            # Its own names, in every form, are answered.
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}",
                         f"[::1]:{port}", "localhost"):
                assert (await c.get("/healthz", headers={"Host": host})).status_code == 200
            same_origin = {"Origin": url}  # the dashboard page's own requests
            r = await c.delete(f"/jobs/{job}", headers=same_origin)
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            r = await c.post("/jobs", json={"batches": 1}, headers=same_origin)
            assert r.status_code == 201
            r = await c.post("/jobs", content=b"{}",  # parameters after the media type
                             headers={"Content-Type": "Application/JSON; charset=utf-8"})
            assert r.status_code == 201


@pytest.mark.asyncio
async def test_listed_hosts_are_answered() -> None:
    app = create_app(Factory(), allowed_hosts=["trainer.example", "10.1.2.3"])
    with anyio.fail_after(DEADLINE):
        async with serving(app) as (_, url), httpx.AsyncClient(base_url=url) as c:
            for host in ("trainer.example", "Trainer.Example:8443", "10.1.2.3:80"):
                assert (await c.get("/jobs", headers={"Host": host})).status_code == 200
            assert (await c.get("/jobs", headers={"Host": "evil.example"})).status_code == 403
            r = await c.post("/jobs", json={}, headers={
                "Host": "trainer.example:8443", "Origin": "https://trainer.example:8443"})
            assert r.status_code == 201  # host and port compared: a TLS proxy in front works
            r = await c.post("/jobs", json={}, headers={
                "Host": "trainer.example", "Origin": "http://trainer.example:8080"})
            assert r.status_code == 403  # another port is another origin
            r = await c.post("/jobs", json={}, headers={
                "Host": "trainer.example", "Origin": "http://trainer.example"})
            assert r.status_code == 201
    async with (
        serving(create_app(Factory(), allowed_hosts=["*"])) as (_, url),
        httpx.AsyncClient(base_url=url) as c,
    ):
        assert (await c.get("/jobs", headers={"Host": "anything"})).status_code == 200


@pytest.mark.asyncio
async def test_a_token_when_set_is_required_on_every_route() -> None:
    factory = Factory()
    with anyio.fail_after(DEADLINE):
        async with serving(create_app(factory, token=TOKEN)) as (server, url):
            assert server.url == f"{url}/?token={TOKEN}"
            async with httpx.AsyncClient(base_url=url) as c:
                for method, path in (("GET", "/jobs"), ("GET", "/healthz"),
                                     ("GET", "/static/dashboard.js"), ("POST", "/jobs"),
                                     ("DELETE", "/jobs/x")):  # fmt: skip
                    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                                    {"Cookie": "trainbus-token-1=" + TOKEN}):
                        r = await c.request(method, path, headers=headers, json={})
                        assert r.status_code == 401, (method, path, headers)
                        assert r.headers["www-authenticate"] == "Bearer"
                        assert "token" in r.json()["error"]
                assert factory.recorders == {}
                r = await c.get(f"/jobs?token={TOKEN}")  # the printed URL: sets the cookie
                assert r.status_code == 200
                port = url.rsplit(":", 1)[1]
                assert r.headers["set-cookie"] == (
                    f"trainbus-token-{port}={TOKEN}; Path=/; HttpOnly; SameSite=Strict"
                )
                assert (await c.get("/jobs")).status_code == 200  # the cookie, from now on
            async with httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as c:
                r = await c.post("/jobs", json={"batches": 1})
                assert r.status_code == 201
                r = await c.get(f"/jobs/{r.json()['id']}/events?since=0")
                assert r.status_code == 200 and "event: end" in r.text
                r = await c.post("/jobs", content=b"{}", headers={"Content-Type": "text/plain"})
                assert r.status_code == 415  # a token does not lift the other checks


def test_listening_beyond_loopback_needs_a_token_or_an_explicit_insecure_flag() -> None:
    with pytest.raises(ValueError, match=r"'0\.0\.0\.0' \(not loopback\).*token.*insecure"):
        create_server(create_app(Factory()), host="0.0.0.0", port=0)
    with pytest.raises(ValueError, match="not loopback"):
        create_server(create_app(Factory()), host="::", port=0)
    create_server(create_app(Factory(), token=TOKEN), host="0.0.0.0", port=0)  # no bind yet
    create_server(create_app(Factory(), insecure_no_token=True), host="0.0.0.0", port=0)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        create_server(create_app(Factory()), host=host, port=0)
    # The Dashboard generates a token for a non-loopback host, as the CLI does.
    assert Dashboard(host="127.0.0.1").token is None
    token = Dashboard(host="0.0.0.0").token
    assert token is not None and len(token) >= 32
    assert Dashboard(host="0.0.0.0", insecure_no_token=True).token is None
    assert Dashboard(host="0.0.0.0", token=TOKEN).token == TOKEN


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token": "short"}, "at least 16 characters"),
        ({"token": "has spaces in the token"}, "at least 16 characters"),
        ({"allowed_hosts": "trainer.example"}, r"list of host names, e.g. \['trainer"),
        ({"allowed_hosts": ["trainer.example:8000"]}, "without scheme or port"),
        ({"allowed_hosts": ["http://trainer.example"]}, "without scheme or port"),
        ({"allowed_hosts": [""]}, "host name"),
    ],
)
def test_bad_access_options_name_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        create_app(Factory(), **kwargs)
    with pytest.raises((ValueError, TypeError), match=message):
        Dashboard(**kwargs)


@pytest.mark.asyncio
async def test_without_a_token_a_request_from_another_machine_is_refused() -> None:
    """Under plain uvicorn (no create_server to refuse the bind): the connection's own
    address says whether it came from another machine."""
    from trainbus.callbacks._guard import Access, Guard

    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        sent.append("reached the app")

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    def scope(server_ip: str, access: Access) -> tuple[Guard, dict[str, Any]]:
        return Guard(app, access), {
            "type": "http", "method": "GET", "path": "/jobs", "scheme": "http",
            "query_string": b"", "server": (server_ip, 8000),
            "headers": [(b"host", f"{server_ip}:8000".encode())],
        }  # fmt: skip

    guard, s = scope("10.0.0.5", Access())
    await guard(s, receive, send)
    assert sent[0]["status"] == 403 and "reached the app" not in sent
    assert b"answers only on loopback" in sent[1]["body"]
    for server_ip, access in (("10.0.0.5", Access(insecure_no_token=True)),
                              ("::ffff:127.0.0.1", Access()), ("127.0.0.1", Access())):
        sent.clear()
        guard, s = scope(server_ip, access)
        s["headers"] = [(b"host", b"localhost:8000")]
        await guard(s, receive, send)
        assert sent == ["reached the app"], server_ip


def test_the_dashboard_refuses_a_foreign_host_and_asks_for_its_token() -> None:
    with Dashboard(port=0) as dashboard:
        base = dashboard.url.rstrip("/")
        for path in ("/", "/events?since=0", "/static/dashboard.js"):
            r = httpx.get(base + path, headers={"Host": "evil.example"}, timeout=DEADLINE)
            assert r.status_code == 403, path
            # Issue 58: the dashboard's refusal names its own option, not the service's jobs
            assert "Dashboard(allowed_hosts=[...])" in r.json()["error"], r.text
            assert "trainbus serve" not in r.json()["error"]
        r = httpx.post(base + "/events", headers={"Origin": "http://evil.example"},
                       timeout=DEADLINE)  # fmt: skip
        assert r.status_code == 403 and "this dashboard's server" in r.json()["error"], r.text
        assert "jobs" not in r.json()["error"]
        assert httpx.get(base + "/", timeout=DEADLINE).status_code == 200
    with Dashboard(port=0, token=TOKEN) as dashboard:
        assert dashboard.url.endswith(f"/?token={TOKEN}")
        base = dashboard.url.split("?")[0].rstrip("/")
        make_trainer(2, loggers=[dashboard]).fit_sync()
        assert httpx.get(base + "/events?since=0", timeout=DEADLINE).status_code == 401
        with httpx.Client(timeout=DEADLINE) as browser_like:
            assert browser_like.get(dashboard.url).status_code == 200  # sets the cookie
            r = browser_like.get(base + "/events?since=0")  # the page's EventSource
            assert r.status_code == 200 and "event: end" in r.text


@pytest.mark.slow  # a child process: the import of torch and uvicorn
def test_the_command_line_prints_its_url_with_the_token() -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "trainbus.serve", "--port", "0", "--token", TOKEN,
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        found = re.fullmatch(rf"trainbus\.serve: (http://127\.0\.0\.1:\d+)/\?token={TOKEN}\n", line)
        assert found, line
        base = found.group(1)
        assert httpx.get(f"{base}/jobs", timeout=DEADLINE).status_code == 401
        r = httpx.get(f"{base}/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
    finally:
        child.terminate()
        child.communicate(timeout=DEADLINE)
