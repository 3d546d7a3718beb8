"""``PrometheusMetrics``: a run's ``/metrics`` and ``/healthz``, for Prometheus and probes.

The callback is a :class:`~trainbus.callbacks._run_watch.RunWatch` (no handler a batch: the
engine's batch clock and the logger's tap feed it; the rest is read when a scrape comes)
with a small HTTP server
on a daemon thread of its own: ``GET /metrics`` (the text format, from a registry of the
callback's own, never the global one) and ``GET /healthz`` (the health check's JSON; 200
when it passes, 503 when it does not). A scrape runs on the server's thread: it reads the
bus's statistics and the run's counters as they are and never waits for the training
thread. :func:`run_families` builds the metrics; ``trainbus.serve`` serves the same ones
for every job (a ``job`` label). Names follow Prometheus' conventions: ``trainbus_``,
base units, ``_total`` for counters, ``_seconds``; ``docs/watching-a-run.md`` lists them.
Needs ``pip install 'trainbus[prometheus]'``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from trainbus.callbacks._run_watch import (
    DEFAULT_MAX_SCALARS,
    DEFAULT_STALL_FACTOR,
    DEFAULT_STALL_FLOOR,
    RunWatch,
)
from trainbus.callbacks.checkpoint_saver import CheckpointSaver
from trainbus.core.callback import blocking

if TYPE_CHECKING:
    from types import TracebackType

    from prometheus_client.registry import CollectorRegistry

    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["PrometheusMetrics", "RunCollector", "run_families"]

Labels = Mapping[str, str]


def missing_extra(exc: ImportError) -> ImportError:
    """The error for a missing ``prometheus_client``, naming the extra to install."""
    return ImportError(
        f"Prometheus metrics need prometheus_client ({exc.name} is missing); install it "
        "with: pip install 'trainbus[prometheus]'"
    )


def _callback_names(names: Sequence[str]) -> list[str]:
    """Callback labels: the class name, ``Name#2`` for a class's second instance."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def _savers(watch: RunWatch) -> list[CheckpointSaver]:
    engine = watch.engine
    if engine is None:
        return []
    return [cb for cb in engine.state.callbacks if isinstance(cb, CheckpointSaver)]


def run_families(runs: Sequence[tuple[Labels, RunWatch]]) -> list[Any]:
    """The metric families of ``runs`` (each a ``(labels, watch)``; every run the same
    label names), for a custom collector's ``collect()``.

    Reads each run as it is now (any thread): its timer, ``engine.statistics()``, its
    checkpoint savers' statistics and the watch's own counters.
    """
    try:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
    except ImportError as exc:
        raise missing_extra(exc) from exc
    keys = list(runs[0][0]) if runs else []
    fams: dict[str, Any] = {}

    def fam(kind: type, name: str, doc: str, extra: Sequence[str] = ()) -> Any:
        if name not in fams:
            fams[name] = kind(name, doc, labels=[*keys, *extra])
        return fams[name]

    def counter(name: str, doc: str, labels: list[str], value: float,
                extra: Sequence[str] = ()) -> None:  # fmt: skip
        fam(CounterMetricFamily, name, doc, extra).add_metric(labels, value)

    def gauge(name: str, doc: str, labels: list[str], value: float,
              extra: Sequence[str] = ()) -> None:  # fmt: skip
        fam(GaugeMetricFamily, name, doc, extra).add_metric(labels, value)

    for run_labels, watch in runs:
        lv = [run_labels[k] for k in keys]
        health = watch.health()
        engine = watch.engine
        ts = engine.state.timestamp if engine is not None else None
        for unit in ("batch", "sample", "token", "epoch"):
            counter(f"trainbus_{unit}es" if unit == "batch" else f"trainbus_{unit}s",
                    f"{unit.capitalize()}es trained (the run's timer)" if unit == "batch"
                    else f"{unit.capitalize()}s trained (the run's timer)",
                    lv, int(getattr(ts, unit)) if ts is not None else 0)  # fmt: skip
        hist = fam(HistogramMetricFamily, "trainbus_step_duration_seconds",
                   "Seconds from one batch's end to the next's (this process)")  # fmt: skip
        clock = watch.clock
        counts, total = list(clock.counts), clock.total
        cumulative, buckets = 0, []
        for bound, count in zip((*clock.bounds, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        hist.add_metric(lv, buckets, total)
        if watch.last_step_time is not None:
            gauge("trainbus_last_step_timestamp_seconds",
                  "Unix time when the last batch completed", lv, watch.last_step_time)  # fmt: skip
        gauge("trainbus_healthy", "1 while the health check passes (/healthz), else 0", lv,
              1.0 if health.ok else 0.0)  # fmt: skip
        fam(GaugeMetricFamily, "trainbus_health", "The health check's status (1 for the "
            "current one)", ["status"]).add_metric([*lv, health.status], 1.0)  # fmt: skip
        gauge("trainbus_stall_deadline_seconds",
              "Seconds without a batch after which the run counts as stalled", lv,
              health.deadline)  # fmt: skip
        for name, value in list(watch.scalars.items()):
            gauge("trainbus_scalar", "The latest value of each logged scalar", [*lv, name],
                  value, ["name"])  # fmt: skip
        counter("trainbus_scalars_dropped", "Logged values of names beyond max_scalars, "
                "not kept", lv, watch.scalars_dropped)  # fmt: skip
        counter("trainbus_fits_failed", "Fits that ended without FIT_END (an error or a "
                "cancellation)", lv, watch.fits_failed)  # fmt: skip
        gauge("trainbus_preempted", "1 once the run has a preemption notice", lv,
              1.0 if watch.preempted else 0.0)  # fmt: skip
        if engine is not None:
            _bus_families(engine.statistics(), lv, counter, gauge)
        _checkpoint_families(watch, lv, counter, gauge)
        account = watch.time_account
        if account is not None:
            for part, seconds in account().items():
                counter("trainbus_time", "Where the fit's wall time went (the time account's "
                        "parts)", [*lv, part], seconds, ["part"])  # fmt: skip
    return list(fams.values())


def _bus_families(stats: Any, lv: list[str], counter: Callable[..., None],
                  gauge: Callable[..., None]) -> None:  # fmt: skip
    counter("trainbus_events_published", "Events the training thread published", lv,
            stats.events_published)  # fmt: skip
    counter("trainbus_barrier_waits", "Waits of the training thread at barriers", lv,
            stats.barrier_waits)  # fmt: skip
    counter("trainbus_barrier_wait_seconds", "Seconds the training thread waited at "
            "barriers", lv, stats.barrier_wait_time)  # fmt: skip
    counter("trainbus_backpressure_wait_seconds", "Seconds the training thread waited for "
            "a full queue", lv, stats.backpressure_wait_time)  # fmt: skip
    gauge("trainbus_queue_depth", "Handler calls queued or running, all callbacks", lv,
          stats.queue_depth)  # fmt: skip
    names = _callback_names([c.name for c in stats.callbacks])
    for name, c in zip(names, stats.callbacks, strict=True):
        cv, cb = [*lv, name], ["callback"]
        counter("trainbus_callback_calls", "Handler calls completed, per callback", cv,
                c.handled, cb)  # fmt: skip
        counter("trainbus_callback_handler_seconds", "Seconds spent in a callback's "
                "handlers", cv, c.total_time, cb)  # fmt: skip
        gauge("trainbus_callback_handler_max_seconds", "A callback's longest handler "
              "call", cv, c.max_time, cb)  # fmt: skip
        gauge("trainbus_callback_queue_depth", "A callback's handler calls queued or "
              "running (a shared pool thread's queue is its callbacks')", cv, c.pending,
              cb)  # fmt: skip
        gauge("trainbus_callback_records_pending", "A destination's records queued", cv,
              c.pending_records, cb)  # fmt: skip
        gauge("trainbus_callback_lag_batches", "Batches a callback trails the training "
              "thread by", cv, c.lag_batches, cb)  # fmt: skip
        counter("trainbus_callback_barrier_wait_seconds", "Seconds the training thread "
                "waited at barriers for this callback", cv, c.barrier_wait_caused, cb)  # fmt: skip
        counter("trainbus_callback_records_dropped", "Whole records a lossy destination "
                "dropped", cv, c.records_dropped, cb)  # fmt: skip


def _checkpoint_families(watch: RunWatch, lv: list[str], counter: Callable[..., None],
                         gauge: Callable[..., None]) -> None:  # fmt: skip
    savers = _savers(watch)
    if not savers:
        return
    stats = [s.statistics() for s in savers]
    counter("trainbus_checkpoints", "Checkpoints captured", lv, sum(s.saves for s in stats))
    written = sum(s.written for s in stats)
    counter("trainbus_checkpoints_written", "Checkpoints complete on disk", lv, written)
    counter("trainbus_checkpoint_capture_seconds", "Seconds the training thread spent "
            "capturing checkpoints", lv, sum(s.capture_seconds for s in stats))  # fmt: skip
    counter("trainbus_checkpoint_wait_seconds", "Seconds the training thread waited for a "
            "previous checkpoint's write", lv, sum(s.wait_seconds for s in stats))  # fmt: skip
    counter("trainbus_checkpoint_write_seconds", "Seconds the writers spent writing "
            "checkpoints", lv, sum(s.write_seconds for s in stats))  # fmt: skip
    counter("trainbus_checkpoint_written_bytes", "Bytes of checkpoints written", lv,
            sum(s.bytes_written for s in stats))  # fmt: skip
    total = sum(s.capture_seconds + s.write_seconds for s in stats)
    last = watch.note_checkpoints(written, total)
    if last is not None:
        when, seconds = last
        gauge("trainbus_checkpoint_last_timestamp_seconds", "Unix time when the last "
              "checkpoint was seen complete", lv, when)  # fmt: skip
        gauge("trainbus_checkpoint_last_duration_seconds", "The last checkpoint's capture "
              "and write, in seconds (the mean of those completed since the previous "
              "scrape)", lv, seconds)  # fmt: skip


class RunCollector:
    """A ``prometheus_client`` collector of one run (or several: ``runs`` is called at
    each scrape and returns ``(labels, watch)`` pairs)."""

    def __init__(self, runs: Callable[[], Sequence[tuple[Labels, RunWatch]]]) -> None:
        self.runs = runs

    def collect(self) -> Iterator[Any]:
        """The families, built now (the scraping thread)."""
        yield from run_families(self.runs())


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        watch = self.server.watch
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            body, status, kind = generate_latest(self.server.registry), 200, CONTENT_TYPE_LATEST
        elif path == "/healthz":
            health = watch.health()
            body = json.dumps(health.as_dict()).encode()
            status, kind = (200 if health.ok else 503), "application/json"
        else:
            body, status, kind = b"not found: GET /metrics or /healthz\n", 404, "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None  # no line on stderr per scrape


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    stopping = False
    watch: RunWatch
    registry: CollectorRegistry


def _serve(server: _Server) -> None:
    """The server's thread: one connection at a time is accepted (each request then runs
    on a thread of its own). It sleeps in ``accept`` between scrapes (no polling: an idle
    endpoint costs the process nothing); :meth:`PrometheusMetrics.stop` wakes it."""
    while not server.stopping:
        server.handle_request()


def _rank_offset() -> int:
    """This process's ``LOCAL_RANK`` (torchrun sets it), else 0."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


class PrometheusMetrics(RunWatch):
    """Serves a run's Prometheus metrics at ``/metrics`` and its health at ``/healthz``.

    Pass it in ``callbacks=[...]``. The server starts with the first fit (or at
    :meth:`start`) and keeps serving after it, until :meth:`stop` or the end of a
    ``with`` block; its thread is a daemon. Under ``torchrun`` every rank serves its own
    endpoint: a fixed ``port`` is offset by the rank's ``LOCAL_RANK`` (9400, 9401, ... on
    each node; ``docs/watching-a-run.md`` has the scrape config and the Kubernetes probe).

    Args:
        port: The first rank's port (``0``: any free port; read :attr:`port`).
        host: The interface (default ``127.0.0.1``; ``0.0.0.0`` for a scraper on another
            machine: the endpoint has no token, it shows counters and scalar names).
        stall_factor, stall_floor: The health check's deadline: no batch for
            ``max(stall_floor, stall_factor x the recent step time)`` seconds is a stall.
        max_scalars: Logged scalar names exported as gauges (the first ones seen).
        labels: Constant labels on every metric (e.g. ``{"run": "exp-12"}``).

    Attributes:
        registry: The callback's own ``CollectorRegistry``.
        time_account: ``None``, or a callable returning ``{part: seconds}`` of the fit's
            time account (exported as ``trainbus_time_seconds_total{part=...}``), e.g.
            ``lambda: trainer.time_account.parts()``.

    Example:
        >>> metrics = PrometheusMetrics(port=9400)
        >>> trainer = Trainer(model, loader, "3ep", callbacks=[metrics])
        >>> trainer.fit_sync()   # curl 127.0.0.1:9400/metrics while it runs
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        stall_factor: float = DEFAULT_STALL_FACTOR,
        stall_floor: float = DEFAULT_STALL_FLOOR,
        max_scalars: int = DEFAULT_MAX_SCALARS,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as exc:
            raise missing_extra(exc) from exc
        super().__init__(stall_factor=stall_factor, stall_floor=stall_floor,
                         max_scalars=max_scalars)  # fmt: skip
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port={port!r} must be an int from 0 to 65535 (0: any free port)")
        if not isinstance(host, str) or not host:
            raise ValueError(f"host={host!r} must be an interface's address, e.g. '127.0.0.1'")
        run_labels = dict(labels or {})
        for key, value in run_labels.items():
            if not (isinstance(key, str) and key.isidentifier() and isinstance(value, str)):
                raise ValueError(
                    f"labels={labels!r}: each label must be a name (letters, digits, _) "
                    "mapped to a string, e.g. {'run': 'exp-12'}"
                )
        self.host = host
        self.port = port + _rank_offset() if port else 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(lambda: [(run_labels, self)]))
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The endpoint's base address (starts the server if needed)."""
        self.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Start serving (a daemon thread); does nothing if it serves already."""
        if self._server is not None:
            return
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server_class = type("_Server", (_Server,), {"address_family": family})
        try:
            server = server_class((self.host, self.port), _Handler)
        except OSError as exc:
            raise OSError(
                f"PrometheusMetrics cannot listen on {self.host}:{self.port} ({exc.strerror});"
                " pick another port=..., or port=0 for any free one"
            ) from exc
        server.watch, server.registry = self, self.registry
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=_serve, args=(server,),
                                        name="trainbus-prometheus", daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (waits for the server's thread)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.stopping = True
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else (
            self.host)  # fmt: skip
        with contextlib.suppress(OSError):  # wake its accept: it sees ``stopping``
            socket.create_connection((host, self.port), timeout=5).close()
        if thread is not None:
            thread.join(timeout=10)
        server.server_close()

    def __enter__(self) -> PrometheusMetrics:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Start the server with the first fit (if :meth:`start` has not)."""
        super().fit_start(state, logger)
        self.start()
