"""Scenario (g) in paired windows: what a trailing 5 ms upload per batch costs, in one run.

``bench_trailing.py`` pairs fresh runs round by round; on this shared 2-core machine its
rounds spread by more than the +0.5 ms target. Here one long training run (the same MLP,
batch and callbacks as its headline rows: the ``@blocking`` weight reader and an
``async def batch_end`` declared ``@trainbus.trailing(2)`` that awaits one POST to a local
server answering after 5 ms) switches the upload on and off in windows of ``--width``
batches, in ABBA or BAAB blocks drawn at random (``--seed``, ``windows.py``): in an "off"
window the handler returns at once.
Each block gives the upload's cost as ``on - off`` in ms per batch (wall clock between the
training thread's ``BATCH_END``s) and in training-thread CPU. Runs alternate with A/A
control runs (every window off: the method's own noise), the runs in ABBA order.

The upload of the last batches of an "on" window trails into the next window (lag 2); the
first ``--settle`` batches of every window are left out of its mean, and the figures without
leaving anything out are printed as well.

The @blocking reader checks the weights it sees against the plain loop's over the first
200 batches of every run (lockstep, D5), as ``bench_trailing.py`` does.

With ``--floor``, no trainbus at all: the hand-written loop over the same model and data, and
the bare mechanism of ``bench_trailing_floor.py`` (one task on a loop thread awaiting the
POSTs in order, handed each batch with ``call_soon_threadsafe``, the training thread waiting
only for the upload of two batches before) uploading in the "on" windows: the floor that any
bus running the upload on an event loop thread in this process pays here.

Run:  PYTHONPATH=src python benchmarks/bench_trailing_windows.py [--blocks 12] [--width 40]
          [--runs 2] [--client httpx|raw|sleep] [--hidden H | --batch-ms 10] [--floor]
          [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import torch
from bench_trailing import BATCH, _step, calibrate, make_data, make_model, reference
from bench_trailing_floor import FloorUploader
from paired_stats import verdict
from trailing_callbacks import LATENCY_MS, TruthReader, Upload
from upload_server import latency_server
from windows import block_differences, is_on, schedule, summarize, window_means

import trainbus

TARGET_MS = 0.5
DISTINCT_BATCHES = 200


class BatchClock(trainbus.Callback):
    """``@blocking`` at ``BATCH_END``: the training thread's wall and CPU clocks per batch."""

    def __init__(self, batches: int) -> None:
        self.wall = [0.0] * (batches + 1)
        self.cpu = [0.0] * (batches + 1)

    @trainbus.blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.wall[0], self.cpu[0] = time.perf_counter(), time.thread_time()

    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        i = int(state.timer.batch)
        self.wall[i], self.cpu[i] = time.perf_counter(), time.thread_time()

    def per_batch(self) -> tuple[list[float], list[float]]:
        """ms per batch, wall and training-thread CPU, from batch 2 on (the first batch
        also carries the fit's start)."""
        wall = [(b - a) * 1e3 for a, b in zip(self.wall[1:], self.wall[2:], strict=False)]
        cpu = [(b - a) * 1e3 for a, b in zip(self.cpu[1:], self.cpu[2:], strict=False)]
        return wall, cpu


class WindowedUpload(Upload):
    """The trailing upload, sent only in "on" windows (never in a control run)."""

    def __init__(self, url: str, client: str, width: int, on: list[bool],
                 control: bool) -> None:
        super().__init__(url, client)
        self.width = width
        self.on = on
        self.control = control

    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        # Batch i (1-based) ends window position of batch index i - 2: per_batch() starts
        # at batch 2, so window k of the measures holds batches 2 + k * width ...
        index = int(state.timer.batch) - 2
        if self.control or index < 0 or not is_on(index, self.width, self.on):
            return
        await super().batch_end(state, logger)


async def one_run(control: bool, args: argparse.Namespace, url: str, hidden: int,
                  data: list[Any], truth_ref: dict[int, float]) -> dict[str, Any]:
    total = args.blocks * 4 * args.width + 1
    truth, clock = TruthReader(), BatchClock(total)
    on = schedule(args.blocks, args.seed)
    upload = WindowedUpload(url, args.client, args.width, on, control)
    model = make_model(hidden)
    trainer = trainbus.Trainer(
        model, data, f"{total}ba", loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=[truth, clock, upload], device="cpu", log_train_loss=False,
        warn_slow_callbacks=False, inline_max=0,
    )
    truth.engine = trainer.engine
    await trainer.fit()
    wall, cpu = clock.per_batch()
    mismatches = sum(truth.seen.get(b) != w for b, w in truth_ref.items() if b <= total)
    return {"control": control, "wall": wall, "cpu": cpu, "sent": upload.sent, "on": on,
            "truth_mismatches": mismatches}


def one_floor_run(control: bool, args: argparse.Namespace, url: str, hidden: int,
                  data: list[Any]) -> dict[str, Any]:
    """The same schedule without trainbus: the plain loop and ``FloorUploader``."""
    total = args.blocks * 4 * args.width + 1
    on = schedule(args.blocks, args.seed)
    model = make_model(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    wall, cpu = [0.0] * (total + 1), [0.0] * (total + 1)
    up = FloorUploader(url, args.client)
    up.start()
    sent = 0
    try:
        for batch in range(1, total + 1):
            x, y = data[(batch - 1) % len(data)]
            _step(model, opt, x, y)
            index = batch - 2  # as WindowedUpload: the measures start at batch 2
            if not control and index >= 0 and is_on(index, args.width, on):
                sent += 1
                up.submit(batch, sent)
            wall[batch], cpu[batch] = time.perf_counter(), time.thread_time()
        up.finish(sent)
    finally:
        up.close()
    per_wall = [(b - a) * 1e3 for a, b in itertools.pairwise(wall[1:])]
    per_cpu = [(b - a) * 1e3 for a, b in itertools.pairwise(cpu[1:])]
    return {"control": control, "wall": per_wall, "cpu": per_cpu, "sent": sent, "on": on,
            "truth_mismatches": 0}


def analyse(runs: list[dict[str, Any]], width: int, settle: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, control in (("upload", False), ("control", True)):
        for measure in ("wall", "cpu"):
            for s in (settle, 0):
                diffs = [d for r in runs if r["control"] is control
                         for d in block_differences(window_means(r[measure], width, s),
                                                    r["on"])]
                out[f"{kind} {measure} settle={s}"] = summarize(diffs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="blocks of 4 windows per run")
    parser.add_argument("--width", type=int, default=40, help="batches per window")
    parser.add_argument("--settle", type=int, default=5,
                        help="batches left out at the start of each window")
    parser.add_argument("--runs", type=int, default=2,
                        help="upload runs; as many control runs, in ABBA order")
    parser.add_argument("--client", default="httpx", choices=("httpx", "tuned", "raw", "sleep"))
    parser.add_argument("--seed", type=int, default=0,
                        help="blocks ABBA or BAAB at random from this seed; -1: ABBA only")
    parser.add_argument("--hidden", type=int, help="hidden width (skips calibration)")
    parser.add_argument("--batch-ms", type=float, default=10.0)
    parser.add_argument("--floor", action="store_true",
                        help="no trainbus: the plain loop and the bare upload mechanism")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.blocks < 1 or args.runs < 1 or not 0 <= args.settle < args.width:
        parser.error("--blocks and --runs must be >= 1, and 0 <= --settle < --width")
    if args.seed < 0:
        args.seed = None
    torch.set_num_threads(1)
    hidden = args.hidden or calibrate(args.batch_ms)
    data = make_data(DISTINCT_BATCHES)
    truth_ref = reference(data, hidden)
    started = time.perf_counter()
    order = [c for i in range(args.runs) for c in ((False, True) if i % 2 == 0 else (True, False))]
    runs = []
    with latency_server(LATENCY_MS) as url:
        for control in order:
            if args.floor:
                runs.append(one_floor_run(control, args, url, hidden, data))
            else:
                runs.append(anyio.run(one_run, control, args, url, hidden, data, truth_ref))
    for r in runs:
        assert r["truth_mismatches"] == 0, "the @blocking reader saw another batch's weights"
    sent = [r["sent"] for r in runs if not r["control"]]
    result = analyse(runs, args.width, args.settle)
    lines = [
        f"MLP 512-{hidden}-10, batch {BATCH}, 1 torch thread; {args.client} upload of "
        f"{LATENCY_MS:g} ms at "
        f"{'lag 2, the bare mechanism (no trainbus)' if args.floor else '@trailing(2)'}; {args.runs} upload run(s) + {args.runs} "
        f"control run(s) of {args.blocks} blocks x 4 windows x {args.width} batches "
        f"({'ABBA' if args.seed is None else f'ABBA or BAAB at random, seed {args.seed}'}) "
        f"({sent[0]} POSTs per upload run; the first {args.settle} batches of each window "
        f"left out, then nothing); load average {os.getloadavg()[0]:.2f} on "
        f"{os.cpu_count()} CPUs; {time.perf_counter() - started:.0f} s",
        "",
        "| on - off, per batch (blocks pooled over runs) | median | 95% CI of the median | "
        "min / p25 / median / p75 / max | blocks |",
        "|---|---|---|---|---|",
    ]
    for name, summary in result.items():
        ci = "-" if summary.interval is None else (
            f"{summary.interval[0]:+.3f} .. {summary.interval[1]:+.3f} ms")
        lines.append(f"| {name} | {summary.median:+.3f} ms | {ci} | "
                     f"{summary.spread.replace(' | ', ' / ')} | {summary.n} |")
    key = f"upload wall settle={args.settle}"
    text = verdict(result[key].interval, TARGET_MS, "blocks")
    what = "The bare mechanism's upload (lag 2)" if args.floor else "The upload at @trailing(2)"
    lines += ["", f"{what}, wall clock, over the same run without it: "
              f"**{text}** for <= +{TARGET_MS} ms/batch ({result[key].line()})."]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({
            "hidden": hidden, "verdict": text, "target": key, "text": "\n".join(lines),
            "args": vars(args) | {"json": str(args.json)},
            "summary": {k: v.__dict__ for k, v in result.items()}, "runs": runs,
        }))


if __name__ == "__main__":
    sys.exit(main())
