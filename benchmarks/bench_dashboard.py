"""Training with the dashboard open in a browser versus closed (issue 19): time and CPU.

The demo's model and data (``DigitsMLP`` on scikit-learn's digits, batch 32, AdamW, one
torch thread) in these arms, each a fresh ``Trainer``:

- ``none``:   no Dashboard at all (for reference: the callback's own cost);
- ``closed``: a ``Dashboard`` in ``loggers=[...]``, nobody looks at the page;
- ``open``:   the same, with a headless Chromium tab (Debian's ``chromium``, via Playwright)
              following the page live: charts, callbacks panel and timeline drawing;
- ``none@pin``, ``closed@pin``, ``open@pin``: the same three with the training process
              (every thread: training, lanes, the dashboard's server) pinned to the first
              CPU and Chromium (with Playwright's driver) to the last one, so that the
              browser never takes the training's core: what a user watching from another
              machine, or on a laptop with cores to spare, would see. Pinning needs two
              CPUs; other programs on the machine stay unpinned.

Per run it measures, between ``FIT_START`` and the return of ``fit()``:

- ``wall``:     wall-clock ms per batch (moves with the machine's load);
- ``train cpu``: the training thread's CPU ms per batch (its thread CPU clock, read by a
                ``@blocking`` handler at ``FIT_START``/``FIT_END``, which runs on that thread);
                on a shared VM it moves with the load too (caches, the host);
- ``wait for a core``: ms per batch the training thread was runnable but had no core
                (``/proc/thread-self/schedstat``): the machine's load, from that thread;
- ``wall less the waits for a core``: wall-clock less that wait: the time the training
                thread ran or waited for something of the process's own (the GIL, a barrier);
                less load-dependent than wall (other programs still share caches and cores);
- ``switches``: the training thread's voluntary and involuntary context switches per batch
                (``getrusage(RUSAGE_THREAD)``): its waits and its preemptions;
- ``proc cpu``:  CPU ms per batch of the whole training process (every thread);
- ``server``:    the dashboard server thread's CPU µs per batch (it shares the GIL with the
                training thread);
- ``chromium``:  CPU seconds per second of training of every Chromium process this script
                started (utime + stime from ``/proc``, through psutil), by process type.

Rounds are short and interleaved (the order of the arms rotates each round); the figures
are paired ratios per round (open/closed, closed/none, unpinned and pinned apart): min, p25,
median, p75, max, and a distribution-free 95% confidence interval of the median ratio (order
statistics of the binomial): the +2% target is *shown* when the interval's top is at most
1.02, *refuted* when its bottom is above 1.02, and *not decided* otherwise.

With ``--screenshot PATH`` it first runs ``trainbus demo``'s training with the page open and
saves a screenshot of the page at the end (``docs/dashboard.png``).

Run:  PYTHONPATH=src python benchmarks/bench_dashboard.py [--rounds 16] [--epochs 4]
      PYTHONPATH=src python benchmarks/bench_dashboard.py --rounds 0 --screenshot docs/dashboard.png
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import threading
import time
from collections import defaultdict
from typing import Any

import psutil
import torch
from paired_stats import median_interval, spread, verdict
from thread_clock import runq_wait

from trainbus import Callback, Trainer, blocking
from trainbus._demo import DigitsMLP, load_digits_loaders, run_demo
from trainbus.callbacks import Dashboard

CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")
ARMS = ("closed", "open", "none", "closed@pin", "open@pin", "none@pin")
SETTLE_S = 0.5
#: A tab has settled once its Chromium processes use less than this (CPU s per s) ...
QUIET = 0.05
#: ... over a window this long (checked for at most SETTLE_MAX_S seconds).
QUIET_WINDOW_S = 0.25
SETTLE_MAX_S = 5.0
#: The paired ratios reported, each ``(numerator arm, denominator arm)``.
PAIRS = (("open", "closed"), ("open@pin", "closed@pin"), ("closed", "none"),
         ("closed@pin", "none@pin"))
TARGET = 1.02


class CpuProbe(Callback):
    """Reads the training thread's CPU clock at ``FIT_START`` and ``FIT_END``."""

    def __init__(self) -> None:
        self.start = self.end = self.runq = 0.0
        self.switches = (0, 0)
        self.thread = ""

    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.thread = threading.current_thread().name
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        self.switches = (usage.ru_nvcsw, usage.ru_nivcsw)
        self.runq = runq_wait()
        self.start = time.thread_time()

    @blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.end = time.thread_time()
        self.runq = runq_wait() - self.runq
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        self.switches = (usage.ru_nvcsw - self.switches[0], usage.ru_nivcsw - self.switches[1])


CPUS = sorted(os.sched_getaffinity(0))


def pin_tasks(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of process ``pid``."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass


def pin(pinned: bool) -> None:
    """Pinned: this process on the first CPU, its children (Playwright's driver, Chromium)
    on the last one. Unpinned: everything on every CPU. Threads started later inherit."""
    train, browser = ({CPUS[0]}, {CPUS[-1]}) if pinned else (set(CPUS), set(CPUS))
    pin_tasks(os.getpid(), train)
    for child in psutil.Process().children(recursive=True):
        pin_tasks(child.pid, browser)


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


def settle() -> float:
    """Wait until Chromium is quiet (the page booted, drew, and only follows the stream);
    returns the seconds waited (``SETTLE_MAX_S``: it never was)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < SETTLE_MAX_S:
        before = sum(chromium_cpu().values())
        time.sleep(QUIET_WINDOW_S)
        if (sum(chromium_cpu().values()) - before) / QUIET_WINDOW_S < QUIET:
            break
    return time.perf_counter() - t0


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
    kind, pinned = arm.split("@")[0], arm.endswith("@pin")
    train, _ = load_digits_loaders(seed=0)
    torch.manual_seed(0)
    model = DigitsMLP()
    board = Dashboard() if kind != "none" else None
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
            if kind == "open":
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(board.url)
                page.wait_for_function("window.trainbusDashboard.status === 'live'")
        pin(pinned)  # after the page's renderer started; before training's threads start
        # Every arm waits the same before it trains: the tab settles (as one opened before
        # a run), and what the previous arm left (threads ending, a closed page) is done.
        gc.collect()
        time.sleep(SETTLE_S)
        settled_after = settle() if page is not None else 0.0
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
            "settle": settled_after,
            "runq": probe.runq * 1e3 / batches,
            "own": (wall - probe.runq) * 1e3 / batches,
            "vcsw": probe.switches[0] / batches,
            "ivcsw": probe.switches[1] / batches,
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


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def col(arm: str, key: str) -> list[float]:
        return [r[key] for r in results[arm]]

    arms = [a for a in ARMS if results.get(a)]
    print(f"\n{args.rounds} interleaved rounds of {args.epochs} epochs per arm; torch threads 1; "
          f"python {platform.python_version()}; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.2f} (at the start: {args.load_at_start:.2f}); @pin: training "
          f"process on CPU {CPUS[0]}, Chromium and Playwright's driver on CPU {CPUS[-1]}\n")
    print("| per arm (median over rounds) | wall ms/batch | train-thread CPU ms/batch | "
          "train-thread wait for a core ms/batch | wall less those waits | "
          "train-thread switches/batch (vol. / invol.) | process CPU ms/batch | "
          "server CPU µs/batch | Chromium CPU s/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        med = {k: statistics.median(col(arm, k)) for k in ("wall", "train_cpu", "runq", "own",
               "vcsw", "ivcsw", "proc_cpu", "server", "chromium")}
        print(f"| {arm} | {med['wall']:.3f} | {med['train_cpu']:.3f} | {med['runq']:.3f} | "
              f"{med['own']:.3f} | "
              f"{med['vcsw']:.2f} / "
              f"{med['ivcsw']:.2f} | {med['proc_cpu']:.3f} | {med['server']:.1f} | "
              f"{med['chromium']:.3f} |")
    print("\n| paired ratio per round | min | p25 | median | p75 | max | 95% CI of the median "
          f"| +{(TARGET - 1) * 100:.0f}% |\n|---|---|---|---|---|---|---|---|")
    for a, b in PAIRS:
        if a not in arms or b not in arms:
            continue
        for key, label in (("wall", "wall"), ("own", "wall less the waits for a core"),
                           ("train_cpu", "train-thread CPU"), ("proc_cpu", "process CPU")):
            ratios = [x / y for x, y in zip(col(a, key), col(b, key), strict=True)]
            interval = median_interval(ratios)
            judged = verdict(interval, TARGET) if a.startswith("open") else ""
            shown = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-"
            print(f"| {a} / {b}, {label} | {spread(ratios)} | {shown} | {judged} |")
    for arm in ("open", "open@pin"):
        if arm not in arms:
            continue
        waits = col(arm, "settle")
        print(f"\n{arm}: the tab settled (Chromium under {QUIET} CPU s/s) after a median "
              f"{statistics.median(waits):.2f} s more (max {max(waits):.2f} s; "
              f"{SETTLE_MAX_S:.0f} s: never)")
        kinds = sorted({k for r in results[arm] for k in r["chromium_by"]})
        print(f"\nChromium CPU s/s in {arm}, by process type (median): " + ", ".join(
            f"{k} {statistics.median([r['chromium_by'].get(k, 0.0) for r in results[arm]]):.3f}"
            for k in kinds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--arms", default=",".join(ARMS), help="a subset of " + ",".join(ARMS))
    parser.add_argument("--screenshot", default=None)
    parser.add_argument("--json", default=None, help="also write every run's figures there")
    args = parser.parse_args()
    args.load_at_start = os.getloadavg()[0]
    arms = tuple(args.arms.split(","))
    if unknown := set(arms) - set(ARMS):
        parser.error(f"--arms: unknown {sorted(unknown)}; use some of {', '.join(ARMS)}")
    if len(CPUS) < 2 and any(a.endswith("@pin") for a in arms):
        print("one CPU: the @pin arms are skipped")
        arms = tuple(a for a in arms if not a.endswith("@pin"))
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        if args.screenshot:
            screenshot(args.screenshot, browser)
        if args.rounds <= 0:
            return
        train_once("open", 1, browser)  # warm-up: imports, kernels, the browser's caches
        results: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
        for r in range(args.rounds):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for arm in order:
                results[arm].append(train_once(arm, args.epochs, browser))
            print(f"round {r + 1}: " + "  ".join(
                f"{a} {results[a][-1]['wall']:.3f} ms ({results[a][-1]['train_cpu']:.3f} cpu)"
                for a in arms), flush=True)
        pin(False)
        browser.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    report(results, args)


if __name__ == "__main__":
    main()
