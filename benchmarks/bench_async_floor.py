"""The floor under SPEC section 7's ``async def`` row: what the mechanism alone costs here.

SPEC section 7 asks <= 2.5 us per no-op ``async def`` handler call with 10 callbacks on the 12
per-batch events (b-async: 120 calls a batch, +0.3 ms/batch). Any bus that runs coroutine
handlers on an event loop thread while the training thread waits at ``BATCH_END`` for them
(D4) pays at least one round trip a batch: wake the loop, let it run the batch's calls, wake
the training thread. This benchmark measures that mechanism with nothing of trainbus in it,
beside trainbus itself, in the same process and rounds (MLP 256-512-10, batch 64, one torch
thread: ``workloads.py``'s ``mlp``), one epoch of 200 batches per arm, arms in a fresh random
order each round:

    plain       the hand-written loop (``workloads.plain_fit``), no hooks
    roundtrip   the same loop with ``plain_fit``'s hooks at the 12 per-batch points (only the
                last one does anything) + at each batch end one ``loop.call_soon_threadsafe`` to a loop
                running in another thread and a wait for its answer (a ``SimpleQueue``):
                the round trip alone, no handler
    floor       roundtrip + the 12 per-batch events appended to a list (one append each)
                and, on the loop, 10 no-op ``async def`` handlers per event awaited by one
                runner coroutine (no ``StopIteration`` per call): no ordering per callback,
                no accounting, no failure handling, no backpressure, no snapshot
    tb-a        trainbus's Trainer, no callbacks (scenario a)
    tb-b-async  trainbus's Trainer, 10 no-op ``async def`` callbacks on the 12 events

Per round, per call: (roundtrip - plain) / 120, (floor - plain) / 120 and
(tb-b-async - tb-a) / 120, in us; over rounds: median with a distribution-free 95% interval
and the spread. If the floor's interval reaches 2.5 us or more, the row cannot be met on
this machine by any bus built this way.

Run:  python benchmarks/bench_async_floor.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))

import paired_stats
import workloads as wl

CALLBACKS = 10
EVENTS = len(wl.PER_BATCH_POINTS)
CALLS = CALLBACKS * EVENTS


class _Noop:
    async def handler(self, state: Any, logger: Any) -> None:
        return None


class LoopThread:
    """An asyncio loop in a thread of its own, and the training side of one round trip."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.answers: SimpleQueue[None] = SimpleQueue()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        handlers = [_Noop().handler for _ in range(CALLBACKS)]
        self.per_event = [handlers] * EVENTS

    async def _runner(self, events: list[int]) -> None:
        per_event = self.per_event
        for event in events:
            for handler in per_event[event]:
                await handler(None, None)

    def _run_batch(self, events: list[int]) -> None:
        try:
            self._runner(events).send(None)
        except StopIteration:
            pass
        self.answers.put(None)

    def round_trip(self, events: list[int]) -> None:
        """Wake the loop to run ``events``' handlers; wait until it has."""
        self.loop.call_soon_threadsafe(self._run_batch, events)
        self.answers.get()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def mechanism_fit(w: wl.Workload, loop: LoopThread, handlers: bool) -> Callable[[Any], None]:
    """One epoch of the plain loop (``workloads.plain_fit`` with hooks at the 12 per-batch
    points) with a round trip at each batch end; with ``handlers``, each point notes its
    event and the batch's 120 calls run on the loop in that round trip."""
    opt = w.optimizer()
    events: list[int] = []
    hooks: dict[str, list[Callable[[Any], None]]] = {}
    for i, point in enumerate(wl.PER_BATCH_POINTS):
        if handlers:
            hooks[point] = [lambda state, i=i: events.append(i)]
    last = wl.PER_BATCH_POINTS[-1]

    def round_trip(state: Any) -> None:
        loop.round_trip(events)  # returns once the loop has run them
        events.clear()

    hooks.setdefault(last, []).append(round_trip)
    return lambda data: wl.plain_fit(w, data, opt, hooks)


def trainbus_fit(w: wl.Workload, callbacks: int) -> Callable[[Any], None]:
    import run_trainbus

    from trainbus import Trainer

    cls = run_trainbus.noop_class("noop-async")

    def fit(data: Any) -> None:
        trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                          callbacks=[cls() for _ in range(callbacks)], device="cpu",
                          log_train_loss=False, warn_slow_callbacks=False)
        trainer.fit_sync()

    return fit


def timed(fit: Callable[[Any], None], data: list[Any]) -> float:
    """ms per batch of one epoch."""
    t0 = time.perf_counter()
    fit(data)
    return (time.perf_counter() - t0) / len(data) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    w = wl.make_workload("mlp")
    data = w.batches
    loop = LoopThread()
    plain_opt = w.optimizer()
    arms: dict[str, Callable[[Any], None]] = {
        "plain": lambda d: wl.plain_fit(w, d, plain_opt),
        "roundtrip": mechanism_fit(w, loop, handlers=False),
        "floor": mechanism_fit(w, loop, handlers=True),
        "tb-a": trainbus_fit(w, 0),
        "tb-b-async": trainbus_fit(w, CALLBACKS),
    }
    for fit in arms.values():  # warm-up: one epoch each
        timed(fit, data)
    rng = random.Random(args.seed)
    ms: dict[str, list[float]] = {name: [] for name in arms}
    started = time.time()
    for _ in range(args.rounds):
        order = list(arms)
        rng.shuffle(order)
        for name in order:
            ms[name].append(timed(arms[name], data))
    loop.close()
    load = os.getloadavg()[0]
    print(f"MLP 256-512-10, batch 64, 1 torch thread; {len(data)} batches per arm and round; "
          f"{args.rounds} rounds in random order (seed {args.seed}); {time.time() - started:.0f} s; "
          f"load average {load:.2f} on {os.cpu_count()} CPUs\n")
    print("| arm | ms/batch, median over rounds |")
    print("|---|---|")
    for name, xs in ms.items():
        print(f"| {name} | {statistics.median(xs):.3f} |")
    rows = [
        ("round trip alone, per batch (ms)", "roundtrip", "plain", 1.0),
        ("round trip alone, spread over 120 calls (us a call)", "roundtrip", "plain", 1e3 / CALLS),
        ("floor: round trip + 120 bare calls (us a call)", "floor", "plain", 1e3 / CALLS),
        ("trainbus b-async over trainbus a (us a call)", "tb-b-async", "tb-a", 1e3 / CALLS),
    ]
    print("\n| per round, paired | median | 95% CI of the median | min / p25 / median / p75 / max |")
    print("|---|---|---|---|")
    for label, arm, base, scale in rows:
        xs = [(a - b) * scale for a, b in zip(ms[arm], ms[base], strict=True)]
        interval = paired_stats.median_interval(xs)
        ci = "n/a" if interval is None else f"{interval[0]:+.2f} .. {interval[1]:+.2f}"
        median = statistics.median(xs)
        print(f"| {label} | {median:+.2f} | {ci} | {paired_stats.spread(xs, '+.2f')} |")
    floor = [(a - b) * 1e3 / CALLS for a, b in zip(ms["floor"], ms["plain"], strict=True)]
    interval = paired_stats.median_interval(floor)
    print("\nSPEC section 7, async def row (<= 2.5 us a call), for the mechanism's floor: "
          + paired_stats.verdict(interval, 2.5))


if __name__ == "__main__":
    main()
