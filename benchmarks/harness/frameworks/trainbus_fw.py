"""trainbus: a fresh ``Trainer`` per epoch, ``fit_sync()``; public API only.

``noop`` callbacks override all 12 per-batch events as plain methods (run on each
callback's thread), ``noop-async`` as ``async def`` (on the loop), ``noop-blocking`` as
``@trainbus.blocking`` (on the training thread). ``upload``: an ``async def batch_end``
awaiting one httpx POST per batch (the peers' work); ``uploader``: the loss logged every
batch to ``HTTPMetricsUploader`` (its delivery finishes at close, inside the timed epoch);
``prometheus``: ``PrometheusMetrics`` in ``callbacks`` (its server started, never scraped).
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import anyio

import trainbus
from harness import workload as wl
from trainbus import Callback, Trainer

NAME = "trainbus"
VERSION = f"trainbus {trainbus.__version__}"
_ACCEPTS = inspect.signature(Trainer).parameters
#: Options that keep the per-batch work equal to the peers' where this tree has them.
QUIET = {
    k: False for k in ("log_train_loss", "warn_slow_callbacks", "progress") if k in _ACCEPTS
}
#: A scenario ending in ``-untracked`` fits without the time account (``track_time=False``):
#: the account's cost is the difference (suite/account_cost.py).
UNTRACKED = "-untracked"


def noop_class(kind: str) -> type[Callback]:
    methods: dict[str, Any] = {}
    for name in wl.PER_BATCH_POINTS:
        if kind == "noop-async":
            async def handler(self: Any, state: Any, logger: Any) -> None:
                return None
        else:
            def handler(self: Any, state: Any, logger: Any) -> None:
                return None
            if kind == "noop-blocking":
                handler = trainbus.blocking(handler)
        methods[name] = handler
    return type(f"NoOp_{kind.replace('-', '_')}", (Callback,), methods)


class _Sleeper(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.005)


class _LogLoss(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        logger.log_metrics({"loss": state.loss})


class _AsyncPost(Callback):
    def __init__(self, url: str) -> None:
        import httpx

        self.url = url
        self.client = httpx.AsyncClient()

    async def batch_end(self, state: Any, logger: Any) -> None:
        point = {"name": "loss", "value": float(state.loss), "step": int(state.timer.batch),
                 "wall_time": time.time()}
        response = await self.client.post(self.url, json={"run": "bench", "points": [point]})
        response.raise_for_status()

    async def close(self, state: Any, logger: Any) -> None:
        await self.client.aclose()


_PROMETHEUS: list[Any] = []


def _prometheus() -> Any:
    """One ``PrometheusMetrics`` per process, its server started at the first (warm-up)
    fit: the measured fits count what a batch costs, not a server's start (a fit's)."""
    if not _PROMETHEUS:
        from trainbus.callbacks import PrometheusMetrics

        _PROMETHEUS.append(PrometheusMetrics())
        _PROMETHEUS[0].start()
    return _PROMETHEUS[0]


def callbacks_for(scenario: str, n: int, url: str | None) -> tuple[list[Any], list[Any]]:
    if scenario.startswith("noop"):
        cls = noop_class(scenario.removesuffix(UNTRACKED))
        return [cls() for _ in range(n)], []
    if scenario == "sleep":
        return [_Sleeper() for _ in range(n)], []
    if scenario == "prometheus":  # PrometheusMetrics (its server idle: no scrape)
        return [_prometheus() for _ in range(n)], []
    assert url is not None
    if scenario == "upload":
        return [_AsyncPost(url) for _ in range(n)], []
    if scenario == "uploader":
        from trainbus.loggers import HTTPMetricsUploader

        return [_LogLoss() for _ in range(n)], [HTTPMetricsUploader(url)]
    raise ValueError(f"trainbus has no scenario {scenario!r}")


def make_fit(w: wl.Workload, scenario: str, n: int, url: str | None) -> tuple[Any, int]:
    options = dict(QUIET)
    if scenario.endswith(UNTRACKED):
        if "track_time" not in _ACCEPTS:
            raise ValueError("this tree has no time account (Trainer(track_time=...))")
        options["track_time"] = False

    def fit(data: Any) -> None:
        callbacks, loggers = callbacks_for(scenario, n, url)
        trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                          callbacks=callbacks, loggers=loggers, device="cpu", **options)
        trainer.fit_sync()

    per_cb = len(wl.PER_BATCH_POINTS) if scenario.startswith("noop") else 1
    return fit, n * per_cb


async def fit_in_loop(w: wl.Workload, callbacks: list[Any], data: Any, **options: Any) -> Any:
    """``await trainer.fit()`` on the caller's loop (lateness, (g)); returns the trainer."""
    trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                      callbacks=callbacks, device="cpu", **{**QUIET, **options})
    await trainer.fit()
    return trainer


__all__ = ["anyio", "callbacks_for", "fit_in_loop", "make_fit", "noop_class"]
