"""A real Prometheus (Debian's ``prometheus`` package) scrapes a training run's
``PrometheusMetrics`` and a ``trainbus.serve`` job; the test asks Prometheus' HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TinyModel, make_loader
from trainbus import Callback, Trainer
from trainbus.callbacks import PrometheusMetrics

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
WAIT = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason="needs Debian's prometheus"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def prometheus(tmp: Path, targets: dict[str, str]) -> Iterator[str]:
    """Prometheus on loopback scraping ``targets`` (job name -> host:port) every second."""
    jobs = "".join(
        f"  - job_name: {name}\n    static_configs: [{{targets: ['{target}']}}]\n"
        for name, target in targets.items()
    )
    config = tmp / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{jobs}")
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def query(api: str, expr: str) -> list[dict[str, Any]]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            result: list[dict[str, Any]] = json.load(r)["data"]["result"]
            return result
    except OSError:
        return []  # not up yet


def until(api: str, expr: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if result := query(api, expr):
            return result
        time.sleep(0.25)
    raise AssertionError(f"Prometheus never answered {expr!r} with a result")


class RunsUntil(Callback):
    """Slows each batch a little and stops the run when the test says so."""

    def __init__(self) -> None:
        self.stop = threading.Event()

    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.005)
        if self.stop.is_set():
            state.stop_training()


def test_prometheus_scrapes_a_run_and_the_service(tmp_path: Path) -> None:
    from trainbus.serve import create_app, create_server

    metrics = PrometheusMetrics()
    runs = RunsUntil()
    trainer = Trainer(TinyModel(), make_loader(50), "1000ep", callbacks=[runs, metrics])
    service_port = free_port()
    server = create_server(create_app(), port=service_port)
    served = threading.Thread(target=server.run, daemon=True)
    served.start()
    fit = threading.Thread(target=trainer.fit_sync)
    fit.start()
    try:
        deadline = time.monotonic() + WAIT
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        body = json.dumps({"epochs": 10_000, "batches": 1000}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{service_port}/jobs", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as r:
            job_id = json.load(r)["id"]
        targets = {"run": metrics.url.removeprefix("http://"),
                   "service": f"127.0.0.1:{service_port}"}  # fmt: skip
        with prometheus(tmp_path, targets) as api:
            service = f'job="service",job_id="{job_id}"'
            for job, selector in (("run", 'job="run"'), ("service", service)):
                # The step counter increases over the last scrapes ...
                until(api, f"increase(trainbus_batches_total{{{selector}}}[10s]) > 0")
                # ... and the last step is recent (Prometheus' clock; 30 s: a loaded machine).
                recent = until(api, f"time() - trainbus_last_step_timestamp_seconds{{{selector}}}")
                assert float(recent[0]["value"][1]) < 30, (job, recent)
                assert until(api, f"trainbus_healthy{{{selector}}}")[0]["value"][1] == "1"
    finally:
        runs.stop.set()
        fit.join(WAIT)
        server.should_exit = True
        served.join(WAIT)
