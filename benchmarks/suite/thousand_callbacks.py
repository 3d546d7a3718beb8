"""1,000 no-op plain callbacks on every per-batch hook (MLP workload): wall clock as a ratio
to the plain loop with no callbacks, paired round by round, beside the peers with 1,000
no-op handlers; and, in a fresh trainbus process, the thread count during the fit (sampled
by a ``@blocking`` handler at every batch) and the process's peak RSS, with 0 and with
1,000 callbacks. The target: threads bounded by the lane pool (``lane_threads``, 8, plus
a constant: the training thread, the main thread, a margin of 2), whatever the number of
callbacks."""

from __future__ import annotations

import resource
import threading
from typing import Any

from harness import stats
from harness.runner import Context

from suite import _wall

FIGURE = "1,000 no-op plain callbacks (wall ratio, threads, peak RSS)"
N = 1000
#: The pool's 8 threads, the main thread, the training thread, and 2 to spare.
THREAD_BOUND = 8 + 4


def measure(n: int, batches: int) -> dict[str, Any]:
    from harness import workload as wl
    from harness.frameworks.trainbus_fw import QUIET, noop_class

    import trainbus

    w = wl.make_workload("mlp", batches)
    counts: list[int] = []

    class Threads(trainbus.Callback):
        @trainbus.blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            counts.append(threading.active_count())

    cls = noop_class("noop")
    trainer = trainbus.Trainer(w.model, w.batches, "1ep", loss_fn=w.loss_fn,
                               optimizers=w.optimizer(), device="cpu",
                               callbacks=[*(cls() for _ in range(n)), Threads()], **QUIET)
    trainer.fit_sync()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"threads": max(counts), "peak_rss_mib": peak}


def run(ctx: Context) -> list[dict[str, Any]]:
    base, tb = ("plain", "noop", 0), ("trainbus_fw", "noop", N)
    arms = [base, tb, *_wall.peer_arms(ctx, "noop", N)]
    times = ctx.interleaved(arms, workload="mlp", batches=10 if ctx.quick else 30, reps=1)
    cells, data = _wall.ratio_cells(ctx, times, base, arms[1:])
    batches = 10 if ctx.quick else 30
    none, many = ctx.child("thousand_callbacks", n=0, batches=batches), \
        ctx.child("thousand_callbacks", n=N, batches=batches)
    s = stats.paired(times[tb], times[base])
    extra = (f"trainbus threads during the fit {many['threads']} (no callbacks: "
             f"{none['threads']}); peak RSS {many['peak_rss_mib']:.0f} MiB (no callbacks: "
             f"{none['peak_rss_mib']:.0f} MiB)")
    verdict = stats.MET if many["threads"] <= THREAD_BOUND else stats.MISSED
    return [stats.row(FIGURE, f"threads <= {THREAD_BOUND} (lane pool + 4); per-call cost flat",
                      "; ".join([cells[0], extra, *cells[1:], *_wall.missing_peers(ctx)]),
                      verdict, short=f"{s.median:.2f}x, {many['threads']} threads",
                      unit="ratio", threads=many["threads"], threads_none=none["threads"],
                      peak_rss_mib=many["peak_rss_mib"],
                      peak_rss_mib_none=none["peak_rss_mib"], **data)]
