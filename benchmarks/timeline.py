"""Timeline of scenario (d): where the time goes when 4 callbacks block 5 ms at BATCH_END.

Trains the benchmark MLP (256-512-10, batch 64, one torch thread) with four plain callbacks
that each `time.sleep(0.005)` at `BATCH_END`, once with the default barrier (`max_lag=0`) and
once with `max_lag=1`, recording a trace (`engine.record_trace()`). Writes, for each:

    docs/timeline-d.json / docs/timeline-d-lag1.json   Chrome trace JSON (open in Perfetto)
    docs/timeline-d.png                                both runs, a few batches, one row per
                                                       lane under the training thread

Run:  python benchmarks/timeline.py [--batches 30] [--show 6]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads

from trainbus import Callback, TraceRecorder, Trainer
from trainbus.bus import PRODUCER_ROW

DOCS = Path(__file__).resolve().parent.parent / "docs"


def make_sleepers() -> list[Callback]:
    classes = [type(f"Upload{i}", (Callback,), {"batch_end": _sleep}) for i in range(1, 5)]
    return [cls() for cls in classes]


def _sleep(self: Any, state: Any, logger: Any) -> None:
    time.sleep(0.005)


def record(batches: int, max_lag: int) -> TraceRecorder:
    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    data = workloads.TimedBatches(w.batches[:batches])
    trainer = Trainer(w.model, data, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
                      callbacks=make_sleepers(), device="cpu", max_lag=max_lag,
                      warn_slow_callbacks=False)
    recorder = trainer.engine.record_trace()
    trainer.fit_sync()
    return recorder


def draw(ax: Any, recorder: TraceRecorder, title: str, first: int, show: int) -> None:
    spans = list(recorder.spans())
    batch_spans = [s for s in spans if s.row == PRODUCER_ROW and s.label.startswith("batch")]
    t_start = batch_spans[first].start
    t_end = batch_spans[min(first + show, len(batch_spans) - 1)].start
    rows = [PRODUCER_ROW, *sorted({s.row for s in spans if s.row != PRODUCER_ROW})]
    colors = {"batch": "#4c72b0", "wait": "#dd8452", "handler": "#55a868"}
    for y, row in enumerate(rows):
        for s in spans:
            if s.row != row or s.start + s.duration < t_start or s.start > t_end:
                continue
            if row != PRODUCER_ROW:
                kind = "handler"
            else:
                kind = "wait" if s.label.startswith("wait") else "batch"
            ax.broken_barh([((s.start - t_start) * 1e3, s.duration * 1e3)], (y - 0.35, 0.7),
                           color=colors[kind], edgecolor="white", linewidth=0.6)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, (t_end - t_start) * 1e3)
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlabel("ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--show", type=int, default=6)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    runs = {"max_lag=0 (default: BATCH_END is a barrier)": record(args.batches, 0),
            "max_lag=1 (handlers may trail by one batch)": record(args.batches, 1)}
    for (_, rec), name in zip(runs.items(), ("timeline-d.json", "timeline-d-lag1.json"), strict=True):
        rec.save(DOCS / name)
    fig, axes = plt.subplots(2, 1, figsize=(11, 6), sharex=False)
    for ax, (title, rec) in zip(axes, runs.items(), strict=True):
        draw(ax, rec, title, first=args.batches // 2, show=args.show)
    fig.legend(handles=[Patch(color="#4c72b0", label="training (forward/backward/step)"),
                        Patch(color="#dd8452", label="training thread waits (barrier)"),
                        Patch(color="#55a868", label="handler: time.sleep(0.005)")],
               loc="lower center", ncol=3, fontsize=9)
    fig.suptitle("4 plain callbacks blocking 5 ms at BATCH_END run side by side: "
                 "a batch pays the slowest, not the sum", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    out = DOCS / "timeline-d.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
