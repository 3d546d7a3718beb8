"""The plain loop: a hand-written torch loop calling its callbacks' hooks directly."""

from __future__ import annotations

from typing import Any

import torch

from harness import workload as wl

NAME = "plain"
VERSION = f"torch {torch.__version__}"


class _NoOp:
    pass


for _point in wl.PER_BATCH_POINTS:
    setattr(_NoOp, _point, lambda self, state: None)


class _Sleeper:
    def batch_end(self, state: Any) -> None:
        wl.sleep_5ms()


class _Uploader:
    def __init__(self, url: str) -> None:
        self.url = url

    def batch_end(self, state: Any) -> None:
        wl.post_metrics(self.url, state.step, state.loss.item())


def make_fit(w: wl.Workload, scenario: str, n: int, url: str | None) -> tuple[Any, int]:
    factory = {"noop": _NoOp, "sleep": _Sleeper, "upload": lambda: _Uploader(url)}[scenario]
    callbacks = [factory() for _ in range(n)]
    hooks = {point: [getattr(cb, point) for cb in callbacks if hasattr(cb, point)]
             for point in wl.PER_BATCH_POINTS}
    calls = sum(len(fns) for fns in hooks.values())
    opt = w.optimizer()

    def fit(data: Any) -> None:
        wl.plain_fit(w, data, opt, hooks if calls else None)

    return fit, calls
