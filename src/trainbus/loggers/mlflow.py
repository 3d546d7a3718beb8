"""``MLflowLogger``: metrics and hyperparameters to an MLflow tracking server, over REST.

It speaks MLflow's REST API (``/api/2.0/mlflow/...``) with httpx on the event loop; the
``mlflow`` package is not needed at run time. At the start of each ``fit()`` it finds or
creates the experiment (``experiments/get-by-name``, ``experiments/create``) and creates
the run (``runs/create``; a continued ``fit()`` reuses it). Points go through
``runs/log-batch`` in batches within MLflow's limits, delivered by the machinery shared
with :class:`~trainbus.loggers.HTTPMetricsUploader` (``_batching.py``: batching by size and
interval, retries with backoff, the spool, the close deadline). ``close`` marks the run
``FINISHED``, or ``FAILED`` when ``fit()`` did not complete (``runs/update``).

Retries are safe: MLflow's SQL store keeps one copy of a metric logged twice with the same
key, step, timestamp and value, and accepts a parameter logged again with the same value.

Exactly once across a crash (``journal``, on by default with a ``spool_dir`` and a
``CheckpointSaver``): the write-ahead journal of ``_journal.py``, as for
:class:`~trainbus.loggers.HTTPMetricsUploader`. Each metric point is journaled with its
wall time before it counts as logged, so a batch resent after a crash carries the same
key, step, timestamp and value (the server keeps one copy); ``state_dict`` records the
MLflow run and the journal's position, so the resumed run logs into the same MLflow run and
drops the points the killed run journaled after the checkpoint. Parameters are not
journaled: the resumed run logs them again (MLflow accepts the same value twice).
"""

from __future__ import annotations

import base64
import json
import math
import numbers
import os
import re
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.core.exceptions import TrackingServerError
from trainbus.core.renamed import renamed_option
from trainbus.loggers._batching import BatchingDestination
from trainbus.loggers._delivery import (
    MetricsUploadWarning,
    Reply,
    RetryableReply,
    require_httpx,
    retryable,
    send,
)

if TYPE_CHECKING:
    import httpx

    from trainbus.core.logger import Logger, LogRecord
    from trainbus.core.state import State
    from trainbus.loggers._spool import Batch

__all__ = ["MLflowLogger", "TrackingServerError"]

MAX_METRICS = 1000  # per runs/log-batch request, as MLflow enforces (400 beyond)
MAX_PARAMS = 100
MAX_BYTES = 1_000_000
MAX_PARAM_VALUE = 6000  # characters; longer values are cut (MLflow refuses them)
MAX_KEY = 250
_BAD_KEY_CHARS = re.compile(r"[^\w./\- :]")  # MLflow refuses a request with other characters
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _metric_value(value: Any) -> float | str | None:
    """A number as MLflow's JSON takes it (NaN and infinities as strings), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else _NON_FINITE[number]


class MLflowLogger(BatchingDestination):
    """Logs metrics and hyperparameters to an MLflow tracking server, off the training path.

    Requires the ``http`` extra (``pip install 'trainbus[http]'``); not the ``mlflow``
    package. The tracking URI and token default to ``MLFLOW_TRACKING_URI`` and
    ``MLFLOW_TRACKING_TOKEN`` (sent as ``Authorization: Bearer``), or
    ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (basic auth), as MLflow's
    own client reads them. The section "MLflowLogger" of ``docs/loggers.md`` has the rest.

    Args:
        tracking_uri: The server, e.g. ``"http://127.0.0.1:5000"``; default
            ``MLFLOW_TRACKING_URI``. Only ``http(s)`` servers (not ``file:`` stores).
        experiment_name: Found or created; default ``MLFLOW_EXPERIMENT_NAME`` or
            ``"Default"``.
        run_name: The run's name; default ``state.run_name``.
        tags: Tags of the run (names to strings).
        token: A bearer token; default ``MLFLOW_TRACKING_TOKEN``.
        batch_size: Metrics per request at most (MLflow's limit: 1000).
        flush_seconds: Seconds; buffered points are sent at least this often.
        flush_interval: Deprecated name of ``flush_seconds`` (warns once).
        spool_dir: A directory where each batch is written before its first attempt
            (resent by the next logger started on it, to the same run).
        journal: Keep a write-ahead journal of every metric point in ``spool_dir`` (which
            it requires) and save the MLflow run and the journal's position in each
            checkpoint, so that a run killed and resumed from its checkpoint holds every
            point of the uninterrupted run once, in one MLflow run. ``None`` (the default)
            journals when there is a ``spool_dir`` and the run has a ``CheckpointSaver``;
            ``False`` never. Without it, a resumed run creates a new MLflow run and the
            points logged after the checkpoint are logged again. See
            ``docs/crash-consistency.md``.
        timeout: Seconds one request may take as a whole.
        close_timeout: Seconds ``close`` waits for delivery.
        backoff: Seconds before the first retry; doubles per retry.
        max_backoff: Seconds; the cap of the doubling.

    Attributes:
        run_id: The MLflow run's id once created, else ``None``.
        experiment_id: The experiment's id once known, else ``None``.

    Raises:
        ImportError: httpx is not installed.
        ValueError: No tracking URI, or an argument is out of range; the message names it.

    Example:
        >>> mlflow_logger = MLflowLogger("http://127.0.0.1:5000", experiment_name="demo")
        >>> await Trainer(model, loader, "2ep", loggers=[mlflow_logger]).fit()
        >>> mlflow_logger.run_id
        '3f2a...'
    """

    rank_zero_only = True  # under torchrun: rank 0 only (docs/distributed.md)
    #: Its handlers read only their event's snapshot and the records it receives, never
    #: the live model: they may trail training by 2 batches (``docs/concurrency.md``,
    #: "Trailing handlers"). A subclass that reads live state sets ``trailing = None``.
    trailing = 2

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        token: str | None = None,
        batch_size: int = MAX_METRICS,
        flush_seconds: float = 1.0,
        spool_dir: str | os.PathLike[str] | None = None,
        timeout: float = 10.0,
        close_timeout: float = 30.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        journal: bool | None = None,
        flush_interval: float | None = None,
    ) -> None:
        httpx = require_httpx("MLflowLogger")
        if journal is not None and not isinstance(journal, bool):
            raise TypeError(f"journal={journal!r} must be True, False or None (the default)")
        if journal and spool_dir is None:
            raise ValueError(
                "journal=True needs a spool_dir to keep the journal in; pass "
                "spool_dir='runs/spool', or journal=False"
            )
        uri = tracking_uri if tracking_uri is not None else os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise ValueError(
                "MLflowLogger needs a tracking server: pass tracking_uri='http://host:5000' "
                "or set MLFLOW_TRACKING_URI"
            )
        try:
            parsed = httpx.URL(uri)
        except (httpx.InvalidURL, TypeError):
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(
                f"tracking_uri={uri!r} is not an http(s) URL; MLflowLogger speaks to a "
                "tracking server (start one with: mlflow server --port 5000) and takes e.g. "
                "'http://127.0.0.1:5000'"
            )
        if isinstance(batch_size, int) and not isinstance(batch_size, bool) and (
            batch_size > MAX_METRICS
        ):
            raise ValueError(
                f"batch_size={batch_size!r} is above MLflow's limit of {MAX_METRICS} "
                f"metrics per request; use at most {MAX_METRICS}"
            )
        for name, value in (("experiment_name", experiment_name), ("run_name", run_name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name}={value!r} must be a non-empty str or None")
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError(f"tags must be a mapping of names to strings, got {tags!r}")
        super().__init__(
            str(parsed),
            batch_size=batch_size,
            flush_interval=renamed_option(
                "MLflowLogger", "flush_interval", flush_interval, "flush_seconds", flush_seconds,
                default=1.0,
            ),
            spool_dir=spool_dir,
            journal=journal,
            timeout=timeout,
            close_timeout=close_timeout,
            backoff=backoff,
            max_backoff=max_backoff,
        )
        self.tracking_uri = str(parsed).rstrip("/")
        self.experiment_name = (
            experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        )
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._api = httpx.URL(self.tracking_uri + "/api/2.0/mlflow/")
        self._headers = {"Content-Type": "application/json"}
        token = token if token is not None else os.environ.get("MLFLOW_TRACKING_TOKEN")
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif user:
            password = os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
            pair = base64.b64encode(f"{user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {pair}"
        self._keys_seen: dict[str, str] = {}
        self._journal_run: str | None = None  # look up the run tagged with this journal id
        self._heads: dict[str, str] = {}  # name -> '{"key":"<key>","value":'
        self._renamed: dict[str, str] = {}

    # -- exactly once (docs/crash-consistency.md) --------------------------------------------

    def _why_not_exactly_once(self) -> str:
        if self.spool_dir is None:
            return (
                "MLflowLogger has no spool_dir, so a resumed run logs into a new MLflow run "
                "and cannot hold each point once; pass spool_dir='...' (with a "
                "CheckpointSaver it then journals every point)"
            )
        return (
            "MLflowLogger(journal=False) cannot hold each point once across a crash; leave "
            "journal at its default (None) or pass journal=True"
        )

    async def fit_start(self, state: State, logger: Logger) -> None:
        """Open the journal (reading what a killed run left) off the event loop."""
        if self._journal is not None:
            await anyio.to_thread.run_sync(self._journal.open)

    def state_dict(self) -> dict[str, Any]:
        """With a journal: the MLflow run and the journal's position at this checkpoint."""
        if self._journal is None:
            return {}
        return {"run_id": self.run_id, "experiment_id": self.experiment_id,
                **self._journal.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """With a journal: log into the saved MLflow run; drop the points journaled after it."""
        if self._journal is None or not state:
            return
        if state.get("run_id"):
            self.run_id = str(state["run_id"])
            self.experiment_id = state.get("experiment_id")
        self._journal.load_state_dict(state)
        if self.run_id is None and state.get("journal") == self._journal.ident:
            # saved before the MLflow run was created (a run's start, or a checkpoint that
            # came first): the run tagged with this journal, if the killed run made one
            self._journal_run = self._journal.ident

    def _spoolable(self, batch: Batch) -> bool:
        """A journal holds metric points only: a batch of parameters is sent from memory."""
        return self._journal is None or not any(isinstance(p, dict) and "param" in p
                                                for p in batch.points)  # fmt: skip

    # -- items and batches -----------------------------------------------------------------

    def _key(self, name: str) -> str:
        """``name`` as MLflow accepts it: other characters become ``_``, 250 at most."""
        key = self._keys_seen.get(name)
        if key is None:
            key = self._keys_seen[name] = _BAD_KEY_CHARS.sub("_", name)[:MAX_KEY]
            if key != name:
                self._renamed[name] = key
        return key

    def log_record(self, record: LogRecord) -> None:
        """Encode the record's points and queue them for sending. No I/O.

        A plain ``def``: the logger runs on a thread lane of its own, which the bus wakes
        for a record more cheaply than the event loop (see ``loggers/_inbox.py``); the
        loop is woken once per request's worth of points.
        """
        items = self._items(record)
        if items:
            self._inbox.put(items, record.hyperparameters)

    def _head(self, name: str) -> str:
        """The JSON text of a point of ``name`` up to its value: ``{"key":"...","value":``."""
        head = self._heads[name] = '{"key":' + json.dumps(self._key(name)) + ',"value":'
        return head

    def _items(self, record: LogRecord) -> list[Any]:
        """Metrics as JSON text (one object per point); hyperparameters as param dicts.

        A metric point is encoded here, once, into the text ``runs/log-batch`` sends
        (``{"key","value","timestamp","step"}``): no dict per point and no ``json.dumps``
        of the whole request later. A finite ``float``'s ``repr`` is its JSON; other
        numbers go through :func:`_metric_value`.
        """
        if record.hyperparameters:  # params travel in batches of their own (_add)
            return [
                {"key": self._key(k), "value": str(v)[:MAX_PARAM_VALUE], "param": True}
                for k, v in record.metrics.items()
            ]
        if self._journal is not None:
            return self._journaled(record)
        tail = f',"timestamp":{int(record.wall_time * 1000)},"step":{int(record.step)}}}'
        heads, items = self._heads, []
        for name, value in record.metrics.items():
            head = heads.get(name) or self._head(name)
            if type(value) is float and value - value == 0.0:  # finite (inf - inf is NaN)
                items.append(f"{head}{value!r}{tail}")
                continue
            number = _metric_value(value)
            if number is None:
                self._skipped += 1
                continue
            items.append(f"{head}{json.dumps(number)}{tail}")
        return items

    def _journaled(self, record: LogRecord) -> list[Any]:
        """Metric points as the journal keeps them (dicts, the wall time in seconds), on
        disk before they count as logged; the points the killed run journaled are dropped."""
        assert self._journal is not None
        step, wall_time, items = int(record.step), float(record.wall_time), []
        for name, value in record.metrics.items():
            number = _metric_value(value)
            if number is None:
                self._skipped += 1
                continue
            items.append({"name": name, "value": number, "step": step, "wall_time": wall_time})
        return self._journal.admit(items) if items else items

    async def close(self, state: State, logger: Logger) -> None:
        """Deliver, end the run (``FINISHED`` or ``FAILED``), report (see the base class).

        Also warns once about names MLflow would refuse, which were renamed. A journal is
        deleted when the run completed with every batch delivered, else kept (as
        :class:`~trainbus.loggers.HTTPMetricsUploader` does).
        """
        try:
            await self._close(state, logger)
        finally:
            journal = self._journal
            if journal is not None:
                done = self._completed and not state.stop_requested
                done = done and not (self._outbox or self._buffer or self._to_spool)
                await anyio.to_thread.run_sync(journal.retire if done else journal.close)

    async def _close(self, state: State, logger: Logger) -> None:
        if self._renamed:
            renamed, self._renamed = self._renamed, {}
            warnings.warn(
                f"MLflowLogger: MLflow accepts only letters, digits, '_', '-', '.', ' ', ':' "
                f"and '/' in names (at most {MAX_KEY} characters); logged as: {renamed}. "
                "Rename them where they are logged to choose the names yourself",
                MetricsUploadWarning,
                stacklevel=2,
            )
        await super().close(state, logger)

    def _cut(self, buffer: list[Any]) -> int:
        """Items of one kind, within MLflow's count and size limits per request."""
        params = _is_param(buffer[0])
        limit = MAX_PARAMS if params else min(self.batch_size, MAX_METRICS)
        size = 0
        for n, item in enumerate(buffer[:limit]):
            if _is_param(item) is not params:
                return n
            if not isinstance(item, str) and not params:  # a journaled point
                size += len(item["name"]) + 64
                if size > MAX_BYTES and n > 0:
                    return n
                continue
            size += len(item["key"]) + len(item["value"]) + 64 if params else len(item) + 1
            if size > MAX_BYTES and n > 0:
                return n
        return min(len(buffer), limit)

    # -- requests --------------------------------------------------------------------------

    async def _call(
        self, client: httpx.AsyncClient, method: str, path: str, body: Any = None
    ) -> Reply:
        content = None if body is None else json.dumps(body, allow_nan=False).encode()
        url = self._api.join(path)
        if method == "GET" and body is not None:
            url = url.copy_merge_params(body)
            content = None
        return await send(client, method, url, self._headers, content)

    async def _json(
        self, client: httpx.AsyncClient, method: str, path: str, body: Any = None,
        *, missing: str | None = None,
    ) -> dict[str, Any] | None:
        """The answer's JSON; ``None`` when its ``error_code`` is ``missing``.

        Raises:
            RetryableReply: 408, 429 or 5xx (retried by the caller).
            TrackingServerError: Any other refusal.
        """
        reply = await self._call(client, method, path, body)
        if reply.ok and not reply.truncated:
            parsed: dict[str, Any] = json.loads(reply.body or b"{}")
            return parsed
        if retryable(reply.status):
            raise RetryableReply(reply)
        if missing is not None and missing.encode() in reply.body:
            return None
        raise TrackingServerError(
            f"MLflowLogger: {method} {path} at {self.tracking_uri} was refused: "
            f"{reply.describe()}; check tracking_uri, the token "
            "(MLFLOW_TRACKING_TOKEN) and the experiment name"
        )

    async def _open(self, client: httpx.AsyncClient, state: State) -> str:
        """Find or create the experiment, then create the run (a continued fit reuses it)."""
        if self.run_id is not None:  # a continued fit(): the run is running again
            body = {"run_id": self.run_id, "status": "RUNNING"}
            await self._json(client, "POST", "runs/update", body)
            return self.run_id
        if self.experiment_id is None:
            name = {"experiment_name": self.experiment_name}
            found = await self._json(client, "GET", "experiments/get-by-name", name,
                                     missing="RESOURCE_DOES_NOT_EXIST")
            if found is None:
                created = await self._json(client, "POST", "experiments/create",
                                           {"name": self.experiment_name},
                                           missing="RESOURCE_ALREADY_EXISTS")
                if created is None:  # created meanwhile by someone else: look it up again
                    found = await self._json(client, "GET", "experiments/get-by-name", name)
                    assert found is not None
                    created = found["experiment"]
                self.experiment_id = str(created["experiment_id"])
            else:
                self.experiment_id = str(found["experiment"]["experiment_id"])
        if self._journal_run is not None:  # the run a killed run made for this journal
            search = {
                "experiment_ids": [self.experiment_id],
                "filter": f"tags.`{_JOURNAL_TAG}` = '{self._journal_run}'",
                "max_results": 1,
            }
            found = await self._json(client, "POST", "runs/search", search)
            earlier = (found or {}).get("runs", [])
            if earlier:
                self.run_id = str(earlier[0]["info"]["run_id"])
                body = {"run_id": self.run_id, "status": "RUNNING"}
                await self._json(client, "POST", "runs/update", body)
                return self.run_id
        run_name = self.run_name if self.run_name is not None else state.run_name
        tags = {"mlflow.runName": run_name, "mlflow.source.name": "trainbus", **self.tags}
        if self._journal is not None:  # how a run restarted before its checkpoint finds it
            await anyio.to_thread.run_sync(self._journal.open)  # its id (opened once)
            tags[_JOURNAL_TAG] = self._journal.ident
        run = await self._json(client, "POST", "runs/create", {
            "experiment_id": self.experiment_id,
            "run_name": run_name,
            "start_time": int(time.time() * 1000),
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        })
        assert run is not None
        self.run_id = str(run["run"]["info"]["run_id"])
        return self.run_id

    async def _attempt(self, client: httpx.AsyncClient, batch: Batch) -> Reply:
        metrics: list[str] = []
        params: list[dict[str, Any]] = []
        for item in batch.points:
            if isinstance(item, str):
                metrics.append(item)
            elif "param" in item:
                params.append({"key": item["key"], "value": item["value"]})
            elif "name" in item:  # a journaled point: the same timestamp on every resend
                metrics.append(json.dumps({
                    "key": self._key(item["name"]), "value": item["value"],
                    "timestamp": int(float(item["wall_time"]) * 1000), "step": int(item["step"]),
                }, allow_nan=False))  # fmt: skip
            else:  # a metric dict, spooled by an earlier version
                metrics.append(json.dumps(item, allow_nan=False))
        run, points = json.dumps(batch.run), ",".join(metrics)
        body = f'{{"run_id":{run},"metrics":[{points}],"params":{json.dumps(params)}}}'
        return await send(client, "POST", self._api.join("runs/log-batch"), self._headers,
                          body.encode())

    async def _finish(self, client: httpx.AsyncClient, completed: bool) -> None:
        """Mark the run ``FINISHED`` (or ``FAILED`` when ``fit()`` did not complete)."""
        if self.run_id is None:
            return
        body = {
            "run_id": self.run_id,
            "status": "FINISHED" if completed else "FAILED",
            "end_time": int(time.time() * 1000),
        }
        reply = await self._retry.until_answered(
            lambda: self._call(client, "POST", "runs/update", body), once=self._gave_up
        )
        if reply is not None:
            raise TrackingServerError(f"runs/update was refused: {reply.describe()}")


#: The tag of an MLflow run made by a logger with a journal: the journal's id.
_JOURNAL_TAG = "trainbus.journal"


def _is_param(item: Any) -> bool:
    return isinstance(item, dict) and "param" in item
