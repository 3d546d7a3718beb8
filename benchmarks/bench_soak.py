"""Soak: a million events through the bus with 10 callbacks; memory stays flat (D12).

A producer thread publishes simulated batches through an ``Engine`` the way the trainer
does (``engine.run_cycle`` runs it as the training thread; 12 events per batch in 6
bursts, ``BATCH_END`` a barrier, the timer advanced before it) to 10 callbacks:

- 4 plain (``def``) callbacks with a no-op handler on every per-batch event, one of which
  also logs a metric at every ``BATCH_END``;
- 3 ``async def`` callbacks, the same (one yields to the loop at ``BATCH_END``);
- 2 callbacks with ``@blocking`` handlers (``AFTER_BACKWARD``, ``BATCH_END``);
- 1 ``LoggerDestination`` receiving the logged records (a plain ``log_metrics``).

At 10^4, 10^5 and 10^6 events (``--events`` scales the three checkpoints: N/100, N/10,
N) it prints the process's RSS now and its peak so far (``psutil``, sampled every 64
batches, and the kernel's ``ru_maxrss``), and the throughput since the previous
checkpoint: events/s and handler calls/s. Flat memory means the RSS at 10^6 events is
that at 10^4 plus noise (allocator slack), not growing with the event count. At the end
it checks that nothing was dropped: every logged record reached the destination and every
callback saw every event.

Run:  python benchmarks/bench_soak.py [--events 1000000] [--backend asyncio|trio]
(``PYTHONPATH=src`` first to measure a working tree.) One run takes about a minute per
million events on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from typing import Any

import anyio
import psutil
import torch

from trainbus import Callback, Engine, Event, Logger, LoggerDestination, State, Time, blocking

E = Event
BURSTS = (
    (E.AFTER_DATALOADER, E.BATCH_START, E.BEFORE_TRAIN_BATCH, E.BEFORE_FORWARD),
    (E.AFTER_FORWARD, E.BEFORE_LOSS),
    (E.AFTER_LOSS, E.BEFORE_BACKWARD),
    (E.AFTER_BACKWARD,),
    (E.AFTER_TRAIN_BATCH, E.BATCH_END),
    (E.BATCH_CHECKPOINT,),
)
PER_BATCH = [e for burst in BURSTS for e in burst]
SAMPLE_EVERY = 64  # batches between RSS samples


def _plain(self: Any, state: Any, logger: Any) -> None:
    return None


async def _async(self: Any, state: Any, logger: Any) -> None:
    return None


def _plain_logging(self: Any, state: Any, logger: Any) -> None:
    logger.log_metrics({"soak": 1.0})


async def _async_yielding(self: Any, state: Any, logger: Any) -> None:
    await anyio.sleep(0)


def noop(kind: str, name: str, overrides: dict[str, Any] | None = None) -> Callback:
    """A callback with a no-op ``kind`` handler on every per-batch event."""
    handler = _async if kind == "async" else _plain
    methods: dict[str, Any] = {event.value: handler for event in PER_BATCH}
    methods.update(overrides or {})
    made: Callback = type(name, (Callback,), methods)()
    return made


class Blocking(Callback):
    @blocking
    def after_backward(self, state: Any, logger: Any) -> None:
        return None

    @blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        return None


class Sink(LoggerDestination):
    def __init__(self) -> None:
        self.records = 0

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        self.records += 1


def callbacks() -> tuple[list[Callback], Sink]:
    sink = Sink()
    made = [
        noop("plain", "Plain0", {"batch_end": _plain_logging}),
        noop("plain", "Plain1"),
        noop("plain", "Plain2"),
        noop("plain", "Plain3"),
        noop("async", "Async0", {"batch_end": _async_yielding}),
        noop("async", "Async1"),
        noop("async", "Async2"),
        Blocking(),
        type("Blocking1", (Blocking,), {})(),
        sink,
    ]
    return made, sink


def soak(events: int, backend: str) -> list[dict[str, float]]:
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time(1, "ep"))
    made, sink = callbacks()
    engine = Engine(state, Logger(state), made, warn_slow=False)
    bus = engine._bus  # how the trainer's loop publishes (see benchmarks/bench_bus.py)
    timer = state._timer
    proc = psutil.Process()
    per_batch = len(PER_BATCH)
    batches = -(-events // per_batch)
    marks = sorted({max(per_batch, events // 100), max(per_batch, events // 10), events})
    rows: list[dict[str, float]] = []
    peak = [proc.memory_info().rss]

    def handled() -> int:
        return sum(c.handled for c in engine.statistics().callbacks)

    def produce() -> None:
        publish = bus.publish
        next_mark = 0
        last_t, last_events, last_calls = time.perf_counter(), 0, handled()
        for b in range(1, batches + 1):
            for burst in BURSTS:
                if E.BATCH_END in burst:
                    timer.on_batch_complete(64)
                publish(*burst)
            if b % SAMPLE_EVERY == 0:
                peak[0] = max(peak[0], proc.memory_info().rss)
            published = b * per_batch
            if next_mark < len(marks) and published >= marks[next_mark]:
                bus.wait_all()  # count what was handled up to here
                now, calls, rss = time.perf_counter(), handled(), proc.memory_info().rss
                peak[0] = max(peak[0], rss)
                rows.append({
                    "events": published,
                    "rss_mb": rss / 2**20,
                    "peak_mb": peak[0] / 2**20,
                    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10,
                    "events_per_s": (published - last_events) / (now - last_t),
                    "calls_per_s": (calls - last_calls) / (now - last_t),
                })
                last_t, last_events, last_calls = now, published, calls
                next_mark += 1

    start_rss = proc.memory_info().rss / 2**20
    anyio.run(engine.run_cycle, produce, backend=backend)
    stats = engine.statistics()
    assert sink.records == batches, f"records lost: {sink.records} of {batches}"
    for c in stats.callbacks:
        if c.name.startswith(("Plain", "Async")):
            assert c.handled >= batches * per_batch, (c.name, c.handled)
    print(f"RSS before the run: {start_rss:.1f} MB; peak queue depth "
          f"{stats.peak_queue_depth}; records delivered {sink.records:,}; threads left "
          f"{[t.name for t in threading.enumerate() if t.name.startswith('trainbus-')]}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = soak(args.events, args.backend)
    print(f"{'events':>10} {'RSS MB':>8} {'peak MB':>8} {'maxrss MB':>10} "
          f"{'events/s':>10} {'calls/s':>10}")
    for r in rows:
        print(f"{r['events']:>10,.0f} {r['rss_mb']:>8.1f} {r['peak_mb']:>8.1f} "
              f"{r['maxrss_mb']:>10.1f} {r['events_per_s']:>10,.0f} {r['calls_per_s']:>10,.0f}")
    growth = rows[-1]["peak_mb"] - rows[0]["peak_mb"]
    print(f"peak RSS growth from {rows[0]['events']:,.0f} to {rows[-1]['events']:,.0f} events: "
          f"{growth:+.1f} MB; total {time.perf_counter() - t0:.1f} s ({args.backend})")


if __name__ == "__main__":
    main()
