"""The dashboard's "+2% with a tab open" (issue 19), paired within ONE long training run.

``bench_dashboard.py`` pairs whole short runs; on a shared machine their spread (±12% at the
quartiles) swamps a 2% effect. Here one ``Trainer`` (the demo's ``DigitsMLP`` on the digits,
batch 32, AdamW, one torch thread, a ``Dashboard`` in ``loggers=[...]``) trains without a
break while a headless Chromium tab (Debian's ``chromium``, via Playwright, driven from a
*separate process* so that the driver never takes this process's GIL) toggles in windows of
``--window`` seconds: ``open`` (``page.goto(dashboard.url)``: the page loads, replays the
history, follows the SSE stream and draws) or ``closed`` (``page.goto("about:blank")``: the
stream closes). Windows come in ABBA blocks (``open closed closed open``, then ``closed open
open closed``, ...), so that a drift linear over a block cancels; each block gives one ratio:
the mean ms/batch of its two open windows over that of its two closed ones.

A ``@blocking`` ``batch_end`` handler (the same in every window) writes
``time.perf_counter()`` and the training thread's ``time.thread_time()`` into preallocated
arrays. The driver writes ``perf_counter()`` at each toggle (``CLOCK_MONOTONIC``: the same
clock in both processes) and reads the training thread's ``/proc/<pid>/task/<tid>/schedstat``
(its time waiting for a core) and its Chromium's CPU time. Per window it counts the batches
that start and end inside it, in two spans:

- ``settled``: from ``--settle`` seconds after the toggle (the page's load, history replay
  and first paint; the driver also waits for the page to say ``live``) to the next toggle;
- ``all``:     the whole window: opening the page is part of the cost of a tab.

Figures per window: wall ms/batch, training-thread CPU ms/batch, and wall less the time the
training thread waited for a core (the machine's load). Block ratios open/closed: min, p25,
median, p75, max, the distribution-free 95% CI of the median and the verdict for +2% as
``bench_dashboard.py`` defines it (*shown*: the CI's top <= 1.02; *refuted*: its bottom > 1.02).

It also prints each kind's profile: ms/batch against the time since the toggle, in bins of
``STEP`` seconds (median over the windows of a kind), to show how long opening a page costs
and so whether ``--settle`` is long enough. Windows start after ``--warmup`` seconds of
training, once the dashboard's history (20,000 items, about 2 a batch: full after ~30 s;
a page replays it when it opens) is full, so that every open window opens the same page.

The control (``--no-control`` skips it) is the same run again with a fresh ``Trainer``
and both window kinds ``about:blank`` (an A/A test: the method's own noise, centred on 1.00).

Run:  PYTHONPATH=src python benchmarks/bench_dashboard_windows.py [--windows 96] [--window 2.5]
      [--settle 1] [--warmup 40] [--json out.json]
      (about 2 x (warmup + windows x window) seconds, plus ~20 s: 10 minutes by default)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")
BLANK = "about:blank"
#: The two kinds of window, in ABBA blocks: block b is ``ABBA`` for even b, ``BAAB`` for odd.
KINDS = ("open", "closed")
#: Seconds per bin of a window's profile (ms/batch against the time since the toggle).
STEP = 0.5
#: The items a ``Dashboard()`` keeps for tabs that open later (its default ``history``).
HISTORY = 20_000


def schedule(windows: int) -> list[str]:
    """The kind of each window: ABBA blocks, alternating which kind starts."""
    a, b = KINDS
    out: list[str] = []
    for block in range(windows // 4):
        out += [a, b, b, a] if block % 2 == 0 else [b, a, a, b]
    return out


def schedstat(pid: int, tid: int) -> tuple[float, float]:
    """Seconds thread ``tid`` of process ``pid`` has run, and has waited for a core."""
    fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


# -- the driver: a separate process with the browser ---------------------------------------


def drive(plan: dict[str, Any]) -> dict[str, Any]:
    """Toggle a Chromium tab per ``plan``; returns each toggle's times and readings."""
    import psutil
    from playwright.sync_api import sync_playwright

    me = psutil.Process()

    def chromium_cpu() -> float:
        total = 0.0
        for proc in me.children(recursive=True):
            try:
                if "chrom" in proc.name():
                    times = proc.cpu_times()
                    total += times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total

    def mark() -> dict[str, float]:
        ran, waited = schedstat(plan["pid"], plan["tid"])
        return {"t": time.perf_counter(), "ran": ran, "runq": waited, "chromium": chromium_cpu()}

    began = time.perf_counter()
    url = plan["url"] if not plan["control"] else BLANK
    out: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)  # warm-up: the browser's caches, the page's first load
        time.sleep(plan["window"])
        page.goto(BLANK)
        time.sleep(max(plan["window"], plan["warmup"] - (time.perf_counter() - began)))
        t0 = time.perf_counter()
        for k, kind in enumerate(plan["kinds"]):
            at = t0 + k * plan["window"]
            time.sleep(max(0.0, at - time.perf_counter()))
            start = mark()
            page.goto(url if kind == "open" else BLANK)
            loaded = time.perf_counter()
            if kind == "open" and url != BLANK:
                page.wait_for_function("window.trainbusDashboard.status === 'live'",
                                       polling=50)
            live = time.perf_counter()
            time.sleep(max(0.0, start["t"] + plan["settle"] - time.perf_counter()))
            settled = mark()
            out.append({"kind": kind, "start": start, "settled": settled,
                        "load_s": loaded - start["t"], "live_s": live - start["t"]})
        end = t0 + len(plan["kinds"]) * plan["window"]
        time.sleep(max(0.0, end - time.perf_counter()))
        final = mark()
        page.close()
        browser.close()
    return {"toggles": out, "end": final}


# -- the training process ----------------------------------------------------------------


class BatchClock:
    """Per batch, at ``BATCH_END`` on the training thread: ``perf_counter()`` and the thread's
    CPU clock, into preallocated arrays (``cap`` batches; later ones are not recorded)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.n = 0
        self.wall = array("d", bytes(8 * cap))
        self.cpu = array("d", bytes(8 * cap))
        self.state: Any = None
        self.tid = 0
        self.started = threading.Event()


def make_probe(clock: BatchClock) -> Any:
    """A ``Callback`` that fills ``clock`` (built here so that trainbus imports lazily)."""
    from trainbus import Callback, blocking

    class Probe(Callback):
        @blocking
        def fit_start(self, state: Any, logger: Any) -> None:
            clock.state = state
            clock.tid = threading.get_native_id()
            clock.started.set()

        @blocking
        def batch_end(self, state: Any, logger: Any) -> None:
            i = clock.n
            if i < clock.cap:
                clock.wall[i] = time.perf_counter()
                clock.cpu[i] = time.thread_time()
                clock.n = i + 1

    return Probe()


def span(clock: BatchClock, a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The batches that start and end between marks ``a`` and ``b``: their count, wall and
    training-thread CPU ms per batch, and wall less the share of ``b - a`` the training
    thread spent waiting for a core (from the driver's ``schedstat`` readings)."""
    wall = clock.wall[: clock.n]
    j = bisect_left(wall, a["t"])  # the first batch end at or after a: batches start there
    k = bisect_right(wall, b["t"]) - 1  # the last batch end at or before b
    count = k - j
    if count < 1:
        return {"batches": max(count, 0), "wall": float("nan"), "cpu": float("nan"),
                "own": float("nan"), "runq": float("nan"), "chromium": float("nan")}
    ms = (wall[k] - wall[j]) * 1e3 / count
    waited = (b["runq"] - a["runq"]) / (b["t"] - a["t"])
    return {"batches": count, "wall": ms, "cpu": (clock.cpu[k] - clock.cpu[j]) * 1e3 / count,
            "own": ms * (1 - waited), "runq": waited,
            "chromium": (b["chromium"] - a["chromium"]) / (b["t"] - a["t"])}


def profile(clock: BatchClock, start: float, end: float, step: float) -> list[float]:
    """Wall ms per batch in bins of ``step`` seconds from ``start`` to ``end`` (the batches
    that end in a bin, over the time from the bin's first batch end to its last; NaN for a
    bin with under two batch ends)."""
    wall = clock.wall[: clock.n]
    out = []
    for b in range(int((end - start) / step + 0.1)):
        j = bisect_left(wall, start + b * step)
        k = bisect_right(wall, start + (b + 1) * step) - 1
        out.append((wall[k] - wall[j]) * 1e3 / (k - j) if k > j else float("nan"))
    return out


def train_run(args: argparse.Namespace, control: bool) -> dict[str, Any]:
    """One long training run with the tab toggled in windows; the per-window figures."""
    import torch

    from trainbus import Trainer
    from trainbus._demo import DigitsMLP, load_digits_loaders
    from trainbus.callbacks import Dashboard

    kinds = schedule(args.windows)
    seconds = (len(kinds) + 2) * args.window + args.warmup + 60  # windows, warm-up, launch
    clock = BatchClock(int(seconds / 2e-4))
    train, _ = load_digits_loaders(seed=0)
    torch.manual_seed(0)
    model = DigitsMLP()
    board = Dashboard(history=HISTORY)
    trainer = Trainer(model, train, "1000000ep",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
                      callbacks=[make_probe(clock)], loggers=[board], device="cpu",
                      warn_slow_callbacks=False)
    errors: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit_sync()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with board:
        thread = threading.Thread(target=fit, name="bench-fit")
        thread.start()
        try:
            if not clock.started.wait(60):
                raise RuntimeError(f"training did not start: {errors}")
            plan = {"url": board.url, "pid": os.getpid(), "tid": clock.tid, "kinds": kinds,
                    "window": args.window, "settle": args.settle, "warmup": args.warmup,
                    "control": control}
            done = subprocess.run([sys.executable, __file__, "--driver", json.dumps(plan)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the browser driver failed:\n{done.stderr[-4000:]}")
            driven = json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            if clock.state is not None:
                clock.state.stop_training()
            thread.join()
            published = board.stream.statistics().published
    if errors:
        raise errors[0]
    if clock.n >= clock.cap:
        raise RuntimeError(f"more than {clock.cap} batches: raise BatchClock's cap")
    toggles, windows = driven["toggles"], []
    for i, toggle in enumerate(toggles):
        after = toggles[i + 1]["start"] if i + 1 < len(toggles) else driven["end"]
        windows.append({"kind": toggle["kind"], "load_s": toggle["load_s"],
                        "live_s": toggle["live_s"],
                        "settled_s": toggle["settled"]["t"] - toggle["start"]["t"],
                        "all": span(clock, toggle["start"], after),
                        "settled": span(clock, toggle["settled"], after),
                        "profile": profile(clock, toggle["start"]["t"], after["t"], STEP)})
    return {"control": control, "batches": clock.n, "published": published, "windows": windows,
            "blocks": blocks(windows)}


def blocks(windows: list[dict[str, Any]]) -> list[dict[str, dict[str, float]]]:
    """Per ABBA block and measure: mean of its open windows over mean of its closed ones."""
    out = []
    for b in range(len(windows) // 4):
        block = windows[4 * b : 4 * b + 4]
        ratios: dict[str, dict[str, float]] = {}
        for part in ("settled", "all"):
            ratios[part] = {}
            for key in ("wall", "own", "cpu"):
                o = [w[part][key] for w in block if w["kind"] == "open"]
                c = [w[part][key] for w in block if w["kind"] == "closed"]
                ratios[part][key] = (sum(o) / len(o)) / (sum(c) / len(c))
        out.append(ratios)
    return out


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from bench_dashboard import TARGET
    from paired_stats import median_interval, spread, verdict

    print(f"\n{args.windows} windows of {args.window} s per run (ABBA blocks: "
          f"{args.windows // 4}), settle {args.settle} s; load average at the start "
          f"{args.load_at_start:.2f}, at the end {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} CPUs\n")
    print("| run, window kind | windows | batches/window (settled) | wall ms/batch | "
          "train-thread CPU ms/batch | share of time waiting for a core | Chromium CPU s/s |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        name = "A/A control" if run["control"] else "open/closed"
        for kind in KINDS:
            ws = [w["settled"] for w in run["windows"] if w["kind"] == kind]
            shown = f"about:blank in {kind}'s slots" if run["control"] else kind
            med = {k: median([w[k] for w in ws]) for k in ("batches", "wall", "cpu", "runq",
                                                          "chromium")}
            print(f"| {name}, {shown} | {len(ws)} | {med['batches']:.0f} | {med['wall']:.3f} | "
                  f"{med['cpu']:.3f} | {med['runq']:.3f} | {med['chromium']:.3f} |")
    print("\n| block ratio open/closed (median of windows) | blocks | min | p25 | median | p75 | "
          "max | 95% CI of the median | +2% |\n|---|---|---|---|---|---|---|---|---|")
    labels = {"wall": "wall", "own": "wall less the waits for a core", "cpu": "train-thread CPU"}
    for run in runs:
        name = "A/A control" if run["control"] else "open/closed"
        for part in ("settled", "all"):
            for key, label in labels.items():
                ratios = [b[part][key] for b in run["blocks"]]
                interval = median_interval(ratios)
                shown = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-"
                judged = verdict(interval, TARGET, "blocks") if not run["control"] else ""
                print(f"| {name}, {label}, {part} | {len(ratios)} | {spread(ratios)} | {shown} "
                      f"| {judged} |")
    print(f"\nms/batch against the time since the toggle (bins of {STEP} s; median over the "
          "windows of a kind; the ratio is of the medians):\n")
    bins = min(len(w["profile"]) for run in runs for w in run["windows"])
    print("| run, kind | " + " | ".join(f"{b * STEP:.2f}-" for b in range(bins)) + " |")
    print("|---" * (bins + 1) + "|")
    for run in runs:
        name = "A/A control" if run["control"] else "open/closed"
        rows = {kind: [median([w["profile"][b] for w in run["windows"] if w["kind"] == kind
                               and not math.isnan(w["profile"][b])]) for b in range(bins)]
                for kind in KINDS}
        for kind in KINDS:
            print(f"| {name}, {kind} | " + " | ".join(f"{x:.3f}" for x in rows[kind]) + " |")
        print(f"| {name}, ratio | " + " | ".join(
            f"{o / c:.3f}" for o, c in zip(rows["open"], rows["closed"], strict=True)) + " |")
    for run in runs:
        print(f"\n{'A/A control' if run['control'] else 'open/closed'}: {run['batches']} "
              f"batches; the dashboard published {run['published']} items "
              f"({run['published'] / run['batches']:.2f} a batch; a page replays the last "
              f"{HISTORY} on opening)")
        if not run["control"]:
            opened = [w for w in run["windows"] if w["kind"] == "open"]
            print(f"\nopen windows: the page loaded after a median "
                  f"{median([w['load_s'] for w in opened]):.3f} s and said 'live' after "
                  f"{median([w['live_s'] for w in opened]):.3f} s (max "
                  f"{max(w['live_s'] for w in opened):.3f} s); the settled span began "
                  f"{median([w['settled_s'] for w in opened]):.3f} s after the toggle")


def median(xs: list[float]) -> float:
    """The median (NaN for none)."""
    import statistics

    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=96, help="a multiple of 4 (ABBA blocks)")
    parser.add_argument("--window", type=float, default=2.5, help="seconds per window")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds dropped after each toggle in the 'settled' figures")
    parser.add_argument("--warmup", type=float, default=40.0,
                        help="seconds of training before the first window (the dashboard's "
                        "history fills: each open window's page then replays the same amount)")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the A/A control run")
    parser.add_argument("--json", default=None, help="also write every window's figures there")
    parser.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver is not None:  # the browser's process (started by train_run)
        print(json.dumps(drive(json.loads(args.driver))), flush=True)
        return
    if args.windows < 4 or args.windows % 4:
        parser.error(f"--windows {args.windows}: use a multiple of 4 (ABBA blocks), e.g. 64")
    if not 0 <= args.settle < args.window:
        parser.error(f"--settle {args.settle}: use seconds from 0 to under --window")
    args.load_at_start = os.getloadavg()[0]
    import torch

    torch.set_num_threads(1)
    runs = [train_run(args, control=False)]
    if args.control:
        runs.append(train_run(args, control=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "driver"},
                       "runs": runs}, f)
    report(runs, args)


if __name__ == "__main__":
    main()
