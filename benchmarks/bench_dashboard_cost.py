"""What a ``Dashboard`` costs the training thread, by load-independent measures (issue 19).

No browser: the demo's model and data (``DigitsMLP`` on scikit-learn's digits, batch 32,
AdamW, one torch thread) in interleaved rounds of these arms:

- ``none``:   no logger at all;
- ``sink``:   a ``LoggerDestination`` whose ``log_record`` does nothing: what *any* logger
              costs (with a logger the trainer logs ``loss/train`` at every batch, and the bus
              queues each record on the destination's lane and wakes its thread);
- ``closed``: a ``Dashboard`` in ``loggers=[...]``, nobody looking;
- ``reader``: the same with an SSE reader in another process following the page's stream
              (``events?since=0&bus=1&pack=1&rate=4``, as the page asks): an open tab's cost
              inside the training process, without the browser's own CPU.

Per run, between ``FIT_START`` and ``FIT_END`` (read by ``@blocking`` handlers, which run on
the training thread):

- ``wall``: ms per batch (moves with the machine's load);
- ``cpu``:  the training thread's CPU ms per batch (``time.thread_time()``; on a shared VM it
            moves with the load too: caches, the host);
- ``runq``: ms per batch the training thread waited for a core while runnable
            (``/proc/thread-self/schedstat``): the machine's load, seen from that thread;
- ``vcsw`` / ``ivcsw``: the training thread's voluntary / involuntary context switches per
            batch (``getrusage(RUSAGE_THREAD)``): its waits (for the GIL, a barrier) and its
            preemptions (a woken thread taking its core), counts that depend little on load;
- ``calls``: Python and C function calls per batch on the training thread (a profile hook,
            ``sys.setprofile``, in one separate run per arm): exact and load-independent.

``--callgrind`` adds the training thread's instructions per batch under valgrind's callgrind
(one process per arm, measured region only; about 2 minutes an arm here): exact,
load-independent, and blind to the kernel (a futex wake-up costs instructions there).

Run:  PYTHONPATH=src python benchmarks/bench_dashboard_cost.py [--rounds 8] [--epochs 3]
      PYTHONPATH=src python benchmarks/bench_dashboard_cost.py --rounds 0 --callgrind
A before/after: the same command with ``PYTHONPATH`` on another checkout's ``src``.
Arms ``closed`` and ``reader`` need ``trainbus[service]`` (Starlette, uvicorn); ``reader``
needs httpx; an arm that cannot run is skipped with the reason.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from thread_clock import runq_wait

from trainbus import Callback, LoggerDestination, Trainer, blocking
from trainbus._demo import DigitsMLP, load_digits_loaders

ARMS = ("none", "sink", "closed", "reader")
READER = r"""
import sys, httpx
with httpx.stream("GET", sys.argv[1], timeout=None) as response:
    print("connected", flush=True)
    for _ in response.iter_lines():
        pass
"""


class Probe(Callback):
    """The training thread's clocks at ``FIT_START`` and ``FIT_END`` (optionally its calls)."""

    def __init__(self, count_calls: bool = False) -> None:
        self.count_calls = count_calls
        self.calls: Counter[str] = Counter()
        self.before: tuple[float, int, int, float] = (0.0, 0, 0, 0.0)
        self.delta: tuple[float, int, int, float] = (0.0, 0, 0, 0.0)

    @staticmethod
    def _clocks() -> tuple[float, int, int, float]:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return time.thread_time(), usage.ru_nvcsw, usage.ru_nivcsw, runq_wait()

    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        if self.count_calls:
            calls = self.calls

            def hook(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    calls[frame.f_code.co_qualname] += 1
                elif event == "c_call":
                    calls[getattr(arg, "__qualname__", "?")] += 1

            sys.setprofile(hook)
        self.before = self._clocks()
        if CONTROL:
            _ctl("-i", "on")

    @blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        if CONTROL:
            _ctl("-i", "off")
            _ctl("-d")
        after = self._clocks()
        sys.setprofile(None)
        self.delta = (after[0] - self.before[0], after[1] - self.before[1],
                      after[2] - self.before[2], after[3] - self.before[3])


class NullDestination(LoggerDestination):
    """A destination that receives every record and does nothing with it."""

    def log_record(self, record: Any) -> None:
        return None


def available(arm: str) -> str | None:
    """Why ``arm`` cannot run here (``None``: it can)."""
    try:
        if arm in ("closed", "reader"):
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        if arm == "reader":
            import httpx  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is missing (pip install 'trainbus[service]' httpx)"
    return None


def train_loader() -> Any:
    """The demo's training loader; without scikit-learn, random data of its shape (1,347
    rows of 64 features, 10 classes, batches of 32: 43 batches an epoch)."""
    try:
        return load_digits_loaders(seed=0)[0]
    except ImportError:
        from torch.utils.data import DataLoader, TensorDataset

        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.rand(1347, 64, generator=gen),
                             torch.randint(0, 10, (1347,), generator=gen))
        return DataLoader(data, batch_size=32, shuffle=True, generator=gen)


def train_once(arm: str, epochs: int, count_calls: bool = False) -> dict[str, Any]:
    """Train ``epochs`` epochs in ``arm``; the run's figures per batch."""
    from trainbus.callbacks import Dashboard

    train = train_loader()
    torch.manual_seed(0)
    model = DigitsMLP()
    board = Dashboard() if arm in ("closed", "reader") else None
    loggers: list[Any] = [board] if board else [NullDestination()] if arm == "sink" else []
    probe = Probe(count_calls)
    trainer = Trainer(model, train, f"{epochs}ep",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
                      callbacks=[probe], loggers=loggers, device="cpu",
                      warn_slow_callbacks=False)
    reader = None
    try:
        if board is not None:
            board.start()
            if arm == "reader":
                url = board.url + "events?since=0&bus=1&pack=1&rate=4&buffer=20000"
                reader = subprocess.Popen([sys.executable, "-c", READER, url],
                                          stdout=subprocess.PIPE, text=True)
                assert reader.stdout is not None
                assert reader.stdout.readline() == "connected\n"
                while board.stream.statistics().subscribers < 1:
                    time.sleep(0.01)
        gc.collect()
        time.sleep(0.2)  # what the previous run left (threads ending) is done
        t0 = time.perf_counter()
        trainer.fit_sync()
        wall = time.perf_counter() - t0
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
        if board is not None:
            board.stop()
    n = len(train) * epochs
    cpu, vcsw, ivcsw, runq = probe.delta
    return {"wall": wall * 1e3 / n, "cpu": cpu * 1e3 / n, "runq": runq * 1e3 / n, "vcsw": vcsw / n,
            "ivcsw": ivcsw / n, "calls": sum(probe.calls.values()) / n,
            "by_name": {k: v / n for k, v in probe.calls.items()}}


#: Set in a callgrind child: the probe switches instrumentation on and off.
CONTROL = False

CALLGRIND_CHILD = r"""
import os, subprocess, sys
sys.path.insert(0, {here!r})
import bench_dashboard_cost as b
b.train_once({arm!r}, 1)  # warm-up, not measured
b.CONTROL = True  # callgrind counts from FIT_START to FIT_END of this run
b.train_once({arm!r}, {epochs})
"""


def _ctl(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)


def callgrind(arm: str, epochs: int) -> float:
    """The training thread's instructions per batch of ``arm`` under callgrind."""
    real = subprocess.run([sys.executable, "-c", "import sys; print(sys.executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        script = Path(tmp) / "child.py"
        script.write_text(CALLGRIND_CHILD.format(here=str(Path(__file__).parent), arm=arm,
                                                 epochs=epochs))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                               "--separate-threads=yes", f"--callgrind-out-file={out}",
                               real, str(script)], env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"callgrind run failed:\n{proc.stderr[-3000:]}")
        totals = []
        for dump in Path(tmp).glob("cg.out*"):
            match = re.search(r"^totals: (\d+)", dump.read_text(errors="replace"), re.M)
            if match:
                totals.append(int(match.group(1)))
    train = train_loader()
    # The training thread runs the model: by far the largest of the threads' totals.
    return max(totals) / (len(train) * epochs)


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{min(xs):.3f} | {q[0]:.3f} | {statistics.median(xs):.3f} | {q[2]:.3f} | {max(xs):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    arms = []
    for arm in args.arms.split(","):
        why = available(arm)
        if why:
            print(f"arm {arm} skipped: {why}")
        else:
            arms.append(arm)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn missing: random data of the digits' shape")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} "
          f"CPUs, load average {os.getloadavg()[0]:.2f}; {args.epochs} epochs (one = 43 "
          "batches) per run, torch threads 1", flush=True)
    if args.rounds > 0:
        train_once("closed" if "closed" in arms else "none", 1)  # warm-up
        print("\n| arm | Python/C calls per batch on the training thread |\n|---|---|")
        counted = {arm: train_once(arm, 1, count_calls=True) for arm in arms}
        for arm in arms:
            print(f"| {arm} | {counted[arm]['calls']:.1f} |")
        base = counted.get("none")
        for arm in [a for a in arms if a != "none" and base is not None]:
            assert base is not None
            got, was = counted[arm]["by_name"], base["by_name"]
            diff = {k: got.get(k, 0.0) - was.get(k, 0.0) for k in {*got, *was}}
            top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:12]
            print(f"{arm} - none, calls per batch: " + ", ".join(f"{k} {v:+.2f}" for k, v in top))
        rows: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
                rows[arm].append(train_once(arm, args.epochs))
            print(f"round {r + 1}: " + "  ".join(
                f"{a} {rows[a][-1]['wall']:.3f} ms ({rows[a][-1]['cpu']:.3f} cpu, "
                f"{rows[a][-1]['ivcsw']:.2f} ivcsw)" for a in arms), flush=True)
        print(f"\n{args.rounds} interleaved rounds; per arm: min | p25 | median | p75 | max "
              f"(load average now {os.getloadavg()[0]:.2f})\n")
        print("| arm | figure | min | p25 | median | p75 | max |\n|---|---|---|---|---|---|---|")
        for arm in arms:
            for key, label in (("wall", "wall ms/batch"), ("cpu", "train-thread CPU ms/batch"),
                               ("runq", "train-thread wait for a core ms/batch"),
                               ("vcsw", "voluntary switches/batch"),
                               ("ivcsw", "involuntary switches/batch")):
                print(f"| {arm} | {label} | {spread([x[key] for x in rows[arm]])} |")
        print("\n| paired ratio per round | min | p25 | median | p75 | max |\n|---|---|---|---|---|---|")
        pairs = [(a, b) for a, b in (("sink", "none"), ("closed", "none"), ("closed", "sink"),
                                     ("reader", "closed")) if a in rows and b in rows]
        for a, b in pairs:
            for key in ("wall", "cpu"):
                ratios = [x[key] / y[key] for x, y in zip(rows[a], rows[b], strict=True)]
                print(f"| {a} / {b}, {key} | {spread(ratios)} |")
    if args.callgrind:
        print("\n| arm | training-thread instructions per batch (callgrind) |\n|---|---|")
        for arm in arms:
            if arm != "reader":
                print(f"| {arm} | {callgrind(arm, 2):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
