"""Event-loop lateness p99 while training: a task sleeping 1 ms in a loop records how late
each wake-up is, on an idle loop and while a Trainer fits the MLP on the same loop with 10
``async def`` no-op callbacks on every per-batch event; rounds alternate, in one process."""

from __future__ import annotations

import time
from typing import Any

from harness import stats
from harness.runner import Context

FIGURE = "event-loop lateness p99 while training"
TARGET_MS = 2.0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3


def measure(batches: int, rounds: int) -> dict[str, list[float]]:
    import anyio
    from harness import workload as wl
    from harness.frameworks.trainbus_fw import fit_in_loop, noop_class

    w = wl.make_workload("mlp", batches)
    cls = noop_class("noop-async")
    out: dict[str, list[float]] = {"idle": [], "training": []}

    async def beat(stop: anyio.Event, late: list[float]) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)

    async def during(task: Any) -> float:
        stop, late = anyio.Event(), []
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat, stop, late)
            await task()
            stop.set()
        return p99(late)

    async def train() -> None:
        await fit_in_loop(w, [cls() for _ in range(10)], w.batches)

    async def main() -> None:
        await train()  # warm-up
        for _ in range(rounds):
            out["idle"].append(await during(lambda: anyio.sleep(0.5)))
            out["training"].append(await during(train))

    anyio.run(main)
    return out


def run(ctx: Context) -> list[dict[str, Any]]:
    p = ctx.child("lateness", batches=100 if ctx.quick else 400, rounds=ctx.rounds)
    train, idle = stats.summarize(p["training"]), stats.summarize(p["idle"])
    return [stats.row(FIGURE, f"<= {TARGET_MS:.0f} ms",
                      f"trainbus {train.median:.2f} ms ({train.min:.2f}-{train.max:.2f}); "
                      f"idle loop {idle.median:.2f} ms ({idle.min:.2f}-{idle.max:.2f})",
                      stats.verdict(train.median, train.spread, TARGET_MS), unit="ms",
                      training=train.as_dict(), idle=idle.as_dict())]
