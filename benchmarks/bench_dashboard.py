"""Training with the dashboard open in a browser versus closed (issue 19): time and CPU.

The demo's model and data (``DigitsMLP`` on scikit-learn's digits, batch 32, AdamW, one
torch thread) in three arms:

- ``closed``: a ``Dashboard`` in ``loggers=[...]``, nobody looks at the page;
- ``open``:   the same, with a headless Chromium tab (Debian's ``chromium``, via Playwright)
              following the page live: charts, callbacks panel and timeline drawing;
- ``none``:   no Dashboard at all (for reference: the callback's own cost).

Per run it measures, between ``FIT_START`` and the return of ``fit()``:

- ``wall``:     wall-clock ms per batch (moves with the machine's load);
- ``train cpu``: the training thread's CPU ms per batch (its thread CPU clock, read by a
                ``@blocking`` handler at ``FIT_START``/``FIT_END``, which runs on that thread):
                what the training thread itself computed, load-independent;
- ``proc cpu``:  CPU ms per batch of the whole training process (every thread: training,
                callback lanes, the dashboard's server);
- ``server``:    the dashboard server thread's CPU µs per batch (it shares the GIL with the
                training thread);
- ``chromium``:  CPU seconds per second of training of every Chromium process this script
                started (utime + stime from ``/proc``, through psutil), by process type.

Rounds are interleaved (the order of the arms rotates each round) and each round trains
``--epochs`` epochs per arm; the figures are paired ratios open/closed per round (min,
median, max; the target being at most +2% wall) and the per-arm medians.

With ``--screenshot PATH`` it first runs ``trainbus demo``'s training with the page open and
saves a screenshot of the page at the end (``docs/dashboard.png``).

Run:  PYTHONPATH=src python benchmarks/bench_dashboard.py [--rounds 9] [--epochs 20]
      PYTHONPATH=src python benchmarks/bench_dashboard.py --rounds 0 --screenshot docs/dashboard.png
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import threading
import time
from collections import defaultdict
from typing import Any

import psutil
import torch

from trainbus import Callback, Trainer, blocking
from trainbus._demo import DigitsMLP, load_digits_loaders, run_demo
from trainbus.callbacks import Dashboard

CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")
ARMS = ("closed", "open", "none")
SETTLE_S = 1.0


class CpuProbe(Callback):
    """Reads the training thread's CPU clock at ``FIT_START`` and ``FIT_END``."""

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.thread = ""

    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.thread = threading.current_thread().name
        self.start = time.thread_time()

    @blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.end = time.thread_time()


def chromium_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this script's Chromium processes, by process type."""
    out: dict[str, float] = defaultdict(float)
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" not in proc.name():
                continue
            kind = next((a[7:] for a in proc.cmdline() if a.startswith("--type=")), "browser")
            times = proc.cpu_times()
            out[kind] += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def thread_cpu(thread: threading.Thread | None) -> float:
    """CPU seconds of a live thread of this process (0 without one)."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def in_thread(fn: Any) -> None:
    """Run ``fn`` on another thread (Playwright's sync API owns this one's loop)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def train_once(arm: str, epochs: int, browser: Any) -> dict[str, Any]:
    """Train ``epochs`` epochs in ``arm``; returns the run's figures."""
    train, _ = load_digits_loaders(seed=0)
    torch.manual_seed(0)
    model = DigitsMLP()
    board = Dashboard() if arm != "none" else None
    probe = CpuProbe()
    trainer = Trainer(model, train, f"{epochs}ep",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
                      callbacks=[probe], loggers=[board] if board else [], device="cpu",
                      warn_slow_callbacks=False)
    batches = len(train) * epochs
    page = None
    try:
        if board is not None:
            board.start()
            if arm == "open":
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(board.url)
                page.wait_for_function("window.trainbusDashboard.status === 'live'")
        # Every arm waits the same before it trains: the tab settles (as one opened before
        # a run), and what the previous arm left (threads ending, a closed page) is done.
        gc.collect()
        time.sleep(SETTLE_S)
        server = board._thread if board is not None else None
        marks: dict[str, Any] = {}

        def fit() -> None:
            marks["chromium"] = chromium_cpu()
            marks["server"] = thread_cpu(server)
            marks["proc"] = time.process_time()
            t0 = time.perf_counter()
            trainer.fit_sync()
            marks["wall"] = time.perf_counter() - t0
            marks["proc"] = time.process_time() - marks["proc"]
            marks["server"] = thread_cpu(server) - marks["server"]
            after = chromium_cpu()
            marks["chromium"] = {k: after[k] - marks["chromium"].get(k, 0.0) for k in after}

        in_thread(fit)
        assert probe.thread == "trainbus-train", probe.thread
        if page is not None:  # the page kept up: it has every batch's loss
            page.wait_for_function("window.trainbusDashboard.ended !== null")
            got = page.evaluate("window.trainbusDashboard.loss.count")
            assert got == batches, (got, batches)
        wall = marks["wall"]
        return {
            "wall": wall * 1e3 / batches,
            "train_cpu": (probe.end - probe.start) * 1e3 / batches,
            "proc_cpu": marks["proc"] * 1e3 / batches,
            "server": marks["server"] * 1e6 / batches,
            "chromium": sum(marks["chromium"].values()) / wall,
            "chromium_by": {k: v / wall for k, v in marks["chromium"].items()},
        }
    finally:
        if page is not None:
            page.close()
        if board is not None:
            board.stop()


def screenshot(path: str, browser: Any) -> None:
    with Dashboard() as board:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(board.url)
        with open(os.devnull, "w") as quiet:
            in_thread(lambda: run_demo(epochs=3, out="runs/demo", dashboard=board, stream=quiet))
        page.wait_for_function("window.trainbusDashboard.ended !== null")
        page.wait_for_timeout(600)  # let the last frame paint
        page.screenshot(path=path, full_page=True)
        page.close()
    print(f"wrote {path}")


def spread(xs: list[float], fmt: str = ".3f") -> str:
    return (f"{min(xs):{fmt}} | {statistics.median(xs):{fmt}} | {max(xs):{fmt}}")


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def col(arm: str, key: str) -> list[float]:
        return [r[key] for r in results[arm]]

    print(f"\n{args.rounds} interleaved rounds of {args.epochs} epochs per arm; torch threads 1; "
          f"python {platform.python_version()}; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| per arm (median over rounds) | wall ms/batch | train-thread CPU ms/batch | "
          "process CPU ms/batch | server CPU µs/batch | Chromium CPU s/s |")
    print("|---|---|---|---|---|---|")
    for arm in ARMS:
        print(f"| {arm} | " + " | ".join(
            f"{statistics.median(col(arm, k)):.3f}"
            for k in ("wall", "train_cpu", "proc_cpu", "server", "chromium")) + " |")
    print("\n| paired ratio per round | min | median | max |\n|---|---|---|---|")
    for key, label in (("wall", "wall"), ("train_cpu", "train-thread CPU"),
                       ("proc_cpu", "process CPU")):
        ratios = [o / c for o, c in zip(col("open", key), col("closed", key), strict=True)]
        print(f"| open / closed, {label} | {spread(ratios)} |")
    for key, label in (("wall", "wall"), ("train_cpu", "train-thread CPU"),
                       ("proc_cpu", "process CPU")):
        ratios = [c / n for c, n in zip(col("closed", key), col("none", key), strict=True)]
        print(f"| closed / none, {label} | {spread(ratios)} |")
    kinds = sorted({k for r in results["open"] for k in r["chromium_by"]})
    print("\nChromium CPU s/s with the tab open, by process type (median): " + ", ".join(
        f"{k} {statistics.median([r['chromium_by'].get(k, 0.0) for r in results['open']]):.3f}"
        for k in kinds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--screenshot", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        if args.screenshot:
            screenshot(args.screenshot, browser)
        if args.rounds <= 0:
            return
        train_once("open", 1, browser)  # warm-up: imports, kernels, the browser's caches
        results: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
        for r in range(args.rounds):
            order = ARMS[r % 3 :] + ARMS[: r % 3]
            for arm in order:
                results[arm].append(train_once(arm, args.epochs, browser))
            print(f"round {r + 1}: " + "  ".join(
                f"{a} {results[a][-1]['wall']:.3f} ms ({results[a][-1]['train_cpu']:.3f} cpu, "
                f"chromium {results[a][-1]['chromium']:.3f})" for a in ARMS), flush=True)
        browser.close()
    report(results, args)


if __name__ == "__main__":
    main()
