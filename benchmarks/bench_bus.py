"""Bus costs without a model: what the training thread pays to publish, what the loop does.

For 0, 1, 10 and 50 callbacks with no-op handlers on every per-batch event (plain `def`,
`async def`, and `@blocking` plain), a producer thread publishes simulated batches the way the
trainer does (12 events in 6 bursts, a short GIL-releasing pause standing in for each compute
step, `BATCH_END` a barrier). Reported, medians over repetitions:

    event us     producer-side cost per non-barrier event (time inside publish)
    barrier us   producer-side cost of publishing BATCH_END, including the barrier wait
    batch ms     producer-side cost per simulated 12-event batch
    calls/s      handler calls completed per second of wall time, producer at full speed,
                 barriers=() (throughput of the lanes)

and the event-loop lateness (p50/p99 of a 1 ms heartbeat task) while a producer publishes at
full speed to 10 async callbacks, against the same heartbeat on an idle loop; and the cost
of ``engine.run_event()`` called from plain code (0, 10, 100 no-op callbacks).

Run:  python benchmarks/bench_bus.py [--batches 400] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import torch

from trainbus import Callback, Engine, Event, Logger, State, Time, blocking

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


def noop_class(kind: str) -> type[Callback]:
    methods: dict[str, Any] = {}
    for event in PER_BATCH:
        if kind == "async":
            async def handler(self: Any, state: Any, logger: Any) -> None:
                return None
        elif kind == "suspend":  # an I/O-like handler: it suspends once, every call
            async def handler(self: Any, state: Any, logger: Any) -> None:
                await anyio.sleep(0)
        else:
            def handler(self: Any, state: Any, logger: Any) -> None:
                return None
            if kind == "blocking":
                handler = blocking(handler)
        methods[event.value] = handler
    return type(f"Noop{kind.title()}", (Callback,), methods)


def make_engine(n: int, kind: str, **kw: Any) -> Engine:
    state = State(model=torch.nn.Linear(1, 1), max_duration=Time(1, "ep"))
    cls = noop_class(kind)
    return Engine(state, Logger(state), [cls() for _ in range(n)], warn_slow=False, **kw)


def pause(seconds: float) -> None:
    """Stand-in for a compute step: releases the GIL like torch kernels do."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(0)


def producer_costs(n: int, kind: str, batches: int) -> tuple[float, float, float]:
    engine = make_engine(n, kind)
    bus = engine._bus
    timer = engine.state._timer
    event_t: list[float] = []
    barrier_t: list[float] = []
    batch_t: list[float] = []

    def produce() -> None:
        publish = bus.publish
        perf = time.perf_counter
        for b in range(batches):
            total = 0.0
            for burst in BURSTS:
                if E.BATCH_END in burst:
                    timer.on_batch_complete(64)
                t0 = perf()
                publish(*burst)
                dt = perf() - t0
                total += dt
                if E.BATCH_END in burst:
                    barrier_t.append(dt)
                elif b > 10:
                    event_t.append(dt / len(burst))
                pause(20e-6)
            if b > 10:
                batch_t.append(total)

    anyio.run(engine.run_cycle, produce)
    return (statistics.median(event_t) * 1e6, statistics.median(barrier_t) * 1e6,
            statistics.mean(batch_t) * 1e3)


def throughput(n: int, batches: int) -> float:
    engine = make_engine(n, "async", barriers=(), queue_size=4096)
    bus = engine._bus

    def produce() -> None:
        for _ in range(batches):
            for burst in BURSTS:
                bus.publish(*burst)
        bus.wait_all()

    t0 = time.perf_counter()
    anyio.run(engine.run_cycle, produce)
    elapsed = time.perf_counter() - t0
    handled = sum(c.handled for c in engine.statistics().callbacks)
    return handled / elapsed


async def heartbeat_lateness(work: Callable[[], Any] | None, duration: float) -> list[float]:
    lateness: list[float] = []
    done = threading.Event()

    async def beat() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            await anyio.sleep(0.001)
            lateness.append(time.perf_counter() - t0 - 0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        if work is None:
            await anyio.sleep(duration)
        else:
            await work()
        done.set()
    return lateness


def lateness(batches: int) -> tuple[list[float], list[float]]:
    engine = make_engine(10, "async")
    bus = engine._bus
    timer = engine.state._timer

    def produce() -> None:
        for _ in range(batches):
            for burst in BURSTS:
                if E.BATCH_END in burst:
                    timer.on_batch_complete(64)
                bus.publish(*burst)

    async def main() -> tuple[list[float], list[float]]:
        idle = await heartbeat_lateness(None, 1.0)
        busy = await heartbeat_lateness(lambda: engine.run_cycle(produce), 0)
        return idle, busy

    return anyio.run(main)


def plain_run_event(n: int, calls: int) -> float:
    """Microseconds per ``engine.run_event(...)`` from plain code (no loop running), the way
    Composer users unit-test callbacks: a standing session serves every call."""
    engine = make_engine(n, "sync")
    for _ in range(20):  # the first calls start the session and learn the handlers are cheap
        engine.run_event(E.BATCH_START)
    t0 = time.perf_counter()
    for _ in range(calls):
        engine.run_event(E.BATCH_START)
    elapsed = time.perf_counter() - t0
    engine.close()
    return elapsed / calls * 1e6


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{'callbacks':>9} {'kind':>9} {'event us':>9} {'barrier us':>11} {'batch ms':>9}")
    for n in (0, 1, 10, 50):
        for kind in ("sync", "async", "blocking") if n else ("-",):
            runs = [producer_costs(n, kind if n else "sync", args.batches) for _ in range(args.reps)]
            ev, bar, batch = (statistics.median(r[i] for r in runs) for i in range(3))
            print(f"{n:>9} {kind:>9} {ev:>9.2f} {bar:>11.1f} {batch:>9.3f}")
    for n in (1, 10, 50):
        rates = [throughput(n, args.batches) for _ in range(args.reps)]
        print(f"async handler calls/s with {n:>2} callbacks: {statistics.median(rates):,.0f}")
    for n in (0, 10, 100):
        per_call = [plain_run_event(n, 2000) for _ in range(args.reps)]
        print(f"engine.run_event() from plain code, {n:>3} no-op callbacks: "
              f"{statistics.median(per_call):.1f} us per call (min {min(per_call):.1f})")
    idle, busy = lateness(args.batches * 5)
    print(f"loop lateness idle: p50 {pct(idle, .5):.2f} ms  p99 {pct(idle, .99):.2f} ms")
    print(f"loop lateness busy: p50 {pct(busy, .5):.2f} ms  p99 {pct(busy, .99):.2f} ms "
          "(producer at full speed, 10 async callbacks)")


if __name__ == "__main__":
    main()
