"""Memory over 10^6 logged records: a callback logs 50 metrics at every ``BATCH_END`` of the
tiny workload, a ``LoggerDestination`` counts them; the process's RSS (``/proc/self/statm``)
is sampled by a ``@blocking`` reader. Flat: RSS after all records minus RSS after the first
tenth, at most 5 MiB (allocator slack). Every record must arrive (nothing dropped, D12)."""

from __future__ import annotations

import os
from typing import Any

from harness import stats
from harness.runner import Context

FIGURE = "memory over 10^6 logged records"
PER_BATCH = 50
LIMIT_MIB = 5.0


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(records: int) -> dict[str, Any]:
    from harness import workload as wl
    from harness.frameworks.trainbus_fw import QUIET

    import trainbus

    batches = records // PER_BATCH
    w = wl.make_workload("tiny", 64)
    data = [w.batches[i % 64] for i in range(batches)]
    names = [f"m{i}" for i in range(PER_BATCH)]
    samples: list[tuple[int, float]] = []

    class Log(trainbus.Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            logger.log_metrics({name: 1.0 for name in names})

    class Rss(trainbus.Callback):
        @trainbus.blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            batch = int(state.timer.batch)
            if batch % max(1, batches // 20) == 0:
                samples.append((batch * PER_BATCH, rss_mib()))

    class Count(trainbus.LoggerDestination):
        def __init__(self) -> None:
            self.n = 0

        def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
            self.n += len(metrics)

    sink = Count()
    trainer = trainbus.Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, device="cpu",
                               callbacks=[Log(), Rss()], loggers=[sink], **QUIET)
    trainer.fit_sync()
    return {"samples": samples, "received": sink.n, "logged": batches * PER_BATCH}


def run(ctx: Context) -> list[dict[str, Any]]:
    records = 100_000 if ctx.quick else 1_000_000
    m = ctx.child("memory", records=records)
    samples = m["samples"]
    first = next(rss for n, rss in samples if n >= records // 10)
    growth = samples[-1][1] - first
    values = [rss - first for n, rss in samples if n >= records // 10]
    spread = (max(values) - min(values)) / 2
    complete = m["received"] >= m["logged"]
    verdict = stats.verdict(growth, min(spread, LIMIT_MIB / 2), LIMIT_MIB)
    if not complete:
        verdict = stats.MISSED
    return [stats.row(FIGURE + ("" if not ctx.quick else f" (--quick: {records:,})"),
                      f"flat (<= +{LIMIT_MIB:.0f} MiB after the first tenth)",
                      f"trainbus {growth:+.1f} MiB from {first:.0f} MiB "
                      f"({m['received']:,} of {m['logged']:,} records received)",
                      verdict, unit="MiB", **m)]
