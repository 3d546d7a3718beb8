"""Scenario (g): a 5 ms upload awaited at ``BATCH_END``, lockstep vs ``@trailing(2)`` vs ``max_lag=2``.

Workload: MLP 512-H-10, batch 128, SGD, CPU, ``--threads`` torch threads (1) in every row;
the hidden width H is calibrated so a plain-loop batch costs ``--batch-ms`` (10) ms of CPU
time, so the scenario means the same on any machine (``--hidden`` fixes it instead). Every
trainbus run has two weight readers: a ``@blocking`` ``batch_end`` (on the training thread:
the weights of its batch, by construction) and a plain ``def batch_end`` on its own thread,
which sees the weights of its batch only if the ``BATCH_END`` barrier still waits for it.
Variants:

- ``plain loop``: a hand-written torch loop, no trainbus, for reference;
- ``no upload``: the readers only (the baseline the others are compared with);
- ``no POST``: plus a ``@trainbus.trailing(2)`` ``async def batch_end`` that builds the
  payload and awaits ``anyio.lowlevel.checkpoint()`` instead of the POST (the bus's share);
- ``lockstep``: plus an ``async def batch_end`` that awaits one POST (``httpx.AsyncClient``,
  one kept-alive connection) to ``latency_server.py`` (its own process) answering after 5 ms;
- ``trailing(2)``: the same handler declared ``@trainbus.trailing(2)``;
- ``max_lag=2``: the undecorated handler with ``Trainer(max_lag=2)`` (every callback trails).

Rounds are interleaved (each round runs every variant once, in a rotated order) after one
untimed warm-up round. Wall clock (load-dependent): ms/batch min / median / spread and the
median of per-round paired differences and ratios against ``no upload``. CPU accounting
(does not depend on load), per batch, median over rounds: the training thread between
``FIT_START`` and ``FIT_END`` split into CPU time (``time.thread_time``), run-queue wait
(``/proc/thread-self/schedstat``: runnable, no core free), barrier waits
(``engine.statistics()``) and the rest (``off-CPU other``: asleep but not at a barrier; in
CPython that is waiting for the GIL); its voluntary context switches; CPU time of the event
loop's thread, of the thread reader's thread and of the server process. ``hidden`` is the
demo's figure (``trainbus demo``): ``1 - (waited at barriers and queues + drain after
FIT_END) / handler time``. The script asserts that the thread reader saw the weights of its
batch in every run but ``max_lag=2``.

Run:  PYTHONPATH=src python benchmarks/bench_trailing.py [--rounds 7] [--batches 100]
      [--batch-ms 10] [--threads 1] [--switch-interval-ms 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import torch

import trainbus
from trainbus._demo import exposure

BATCH = 128
LATENCY_MS = 5.0
VARIANTS = ("plain loop", "no upload", "no POST", "lockstep", "trailing(2)", "max_lag=2")
LOCKSTEP_READER = ("no upload", "no POST", "lockstep", "trailing(2)")


def make_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(512, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def make_data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, 512, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
        for _ in range(n)
    ]


def checksum(model: torch.nn.Module) -> float:
    return float(model[0].weight.detach().sum())


def sample() -> dict[str, float]:
    """The calling thread's clocks: wall, CPU, run-queue wait (NaN where the kernel does not
    say), voluntary and involuntary context switches."""
    try:
        runq = int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        runq = math.nan
    vcsw = ivcsw = math.nan
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_THREAD)
        vcsw, ivcsw = usage.ru_nvcsw, usage.ru_nivcsw
    except (ImportError, AttributeError, OSError):
        pass
    return {"wall": time.perf_counter(), "cpu": time.thread_time(), "runq": runq,
            "vcsw": vcsw, "ivcsw": ivcsw}


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


class TruthReader(trainbus.Callback):
    """``@blocking``: on the training thread, the weights right after this batch's step.

    Also samples the training thread's clocks at ``FIT_START`` and ``FIT_END``."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.torch_threads = 0
        self.ident = 0

    @trainbus.blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        self.torch_threads = torch.get_num_threads()
        self.ident = threading.get_ident()
        self.start = sample()

    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)

    @trainbus.blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.end = sample()


class ThreadReader(trainbus.Callback):
    """A plain handler on its own thread: lockstep only while the barrier waits for it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.idents: set[int] = set()

    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)
        self.idents.add(threading.get_ident())
        self.last = sample()
        if not self.first:
            self.first = self.last


class Upload(trainbus.Callback):
    """Awaits one POST per batch (the README's handler) on one kept-alive connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.AsyncClient()
        self.sent = 0

    async def batch_end(self, state: Any, logger: Any) -> None:
        await self.client.post(self.url, json={"batch": int(state.timer.batch)})
        self.sent += 1

    async def close(self, state: Any, logger: Any) -> None:
        await self.client.aclose()


class TrailingUpload(Upload):
    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        await super().batch_end(state, logger)


class NoPost(Upload):
    """The same handler without the request: the payload, then one checkpoint."""

    @trainbus.trailing(2)
    async def batch_end(self, state: Any, logger: Any) -> None:
        json.dumps({"batch": int(state.timer.batch)})
        await anyio.lowlevel.checkpoint()
        self.sent += 1


def server_counts(url: str) -> dict[str, float]:
    with httpx.Client() as client:
        out: dict[str, float] = client.get(url).json()
        return out


def plain_loop(data: list[Any], hidden: int) -> dict[str, float]:
    model = make_model(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before, process = sample(), time.process_time()
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    d, n = delta(before, sample()), len(data)
    return {"ms": d["wall"] * 1e3 / n, "train_cpu": d["cpu"] * 1e3 / n,
            "train_runq": d["runq"] * 1e3 / n, "train_vcsw": d["vcsw"] / n,
            "process_cpu": (time.process_time() - process) * 1e3 / n}


async def trainbus_run(variant: str, data: list[Any], url: str, hidden: int) -> dict[str, Any]:
    truth, reader = TruthReader(), ThreadReader()
    callbacks: list[trainbus.Callback] = [truth, reader]
    upload: Upload | None = None
    if variant != "no upload":
        kind = {"trailing(2)": TrailingUpload, "no POST": NoPost}.get(variant, Upload)
        upload = kind(url)
        callbacks.append(upload)
    model = make_model(hidden)
    trainer = trainbus.Trainer(
        model,
        data,
        "1ep",
        loss_fn=torch.nn.functional.cross_entropy,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=callbacks,
        device="cpu",
        max_lag=2 if variant == "max_lag=2" else 0,
        log_train_loss=False,
        warn_slow_callbacks=False,
    )
    server0 = server_counts(url)
    loop0, process0 = sample(), time.process_time()
    await trainer.fit()
    loop, process = delta(loop0, sample()), time.process_time() - process0
    server = {k: v - server0[k] for k, v in server_counts(url).items()}
    n = len(data)
    stats = trainer.engine.statistics()
    work, waited, hidden_s = exposure(stats, loop0["wall"] + loop["wall"] - truth.end["wall"])
    train = delta(truth.start, truth.end)
    reader_cpu = (reader.last["cpu"] - reader.first["cpu"]) / (n - 1)
    assert upload is None or upload.sent == n
    ms = 1e3 / n
    return {
        "ms": loop["wall"] * ms,
        "train_cpu": train["cpu"] * ms,
        "train_runq": train["runq"] * ms,
        "train_wait": waited * ms,
        "train_other": (train["wall"] - train["cpu"] - train["runq"] - waited) * ms,
        "train_vcsw": train["vcsw"] / n,
        "loop_cpu": loop["cpu"] * ms,
        "reader_cpu": reader_cpu * 1e3,
        "rest_cpu": (process - train["cpu"] - loop["cpu"]) * ms,
        "process_cpu": process * ms,
        "server_cpu": server["cpu_s"] * ms,
        "requests": server["requests"],
        "connections": server["connections"] - 1,  # less the GET after the run
        "torch_threads": truth.torch_threads,
        "reader_threads": len(reader.idents),
        "reader_on_training_thread": truth.ident in reader.idents,
        "hidden": hidden_s / work if work > 0 else 0.0,
        "thread_reader_mismatches": sum(reader.seen[b] != truth.seen[b] for b in truth.seen),
    }


@contextlib.contextmanager
def latency_server() -> Iterator[str]:
    """``latency_server.py`` in its own process (its work does not share our GIL)."""
    script = Path(__file__).resolve().parent / "latency_server.py"
    cmd = [sys.executable, str(script), "--port", "0", "--latency-ms", str(LATENCY_MS)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().strip()
        finally:
            proc.terminate()


def calibrate(batch_ms: float) -> int:
    """The hidden width whose plain-loop batch costs about ``batch_ms`` of CPU time."""
    hidden = 2048
    for _ in range(3):
        data = make_data(6)
        plain_loop(data, hidden)  # warm-up
        cpu = statistics.median(plain_loop(data, hidden)["train_cpu"] for _ in range(3))
        hidden = max(64, round(hidden * batch_ms / cpu / 64) * 64)
    return hidden


async def bench(rounds: int, batches: int, hidden: int) -> dict[str, list[dict[str, Any]]]:
    data = make_data(batches)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with latency_server() as url:
        for r in range(rounds + 1):  # round 0: warm-up, not kept
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for variant in order:
                gc.collect()
                if variant == "plain loop":
                    run = plain_loop(data, hidden)
                else:
                    run = await trainbus_run(variant, data, url, hidden)
                if r:
                    runs[variant].append(run)
    return runs


CPU_COLUMNS = {
    "train_cpu": "training thread CPU",
    "train_runq": "its run-queue wait",
    "train_wait": "its barrier waits",
    "train_other": "its off-CPU other",
    "train_vcsw": "its voluntary switches",
    "loop_cpu": "loop thread CPU",
    "reader_cpu": "thread reader CPU",
    "server_cpu": "server CPU",
    "process_cpu": "process CPU",
}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = [run["ms"] for run in runs["no upload"]]
    base_cpu = [run["train_cpu"] for run in runs["no upload"]]
    out: dict[str, Any] = {}
    for variant, rs in runs.items():
        ms = [run["ms"] for run in rs]
        row: dict[str, Any] = {
            "min": min(ms),
            "median": statistics.median(ms),
            "spread": max(ms) - min(ms),
            "diff_median": statistics.median(m - b for m, b in zip(ms, base, strict=True)),
            "ratio_median": statistics.median(m / b for m, b in zip(ms, base, strict=True)),
            "cpu_diff_median": statistics.median(
                run["train_cpu"] - b for run, b in zip(rs, base_cpu, strict=True)
            ),
        }
        for key in CPU_COLUMNS:
            if key in rs[0]:
                row[key] = statistics.median(run[key] for run in rs)
        if "hidden" in rs[0] and variant not in ("no upload", "no POST"):
            row["hidden_median"] = statistics.median(run["hidden"] for run in rs)
        if "thread_reader_mismatches" in rs[0]:
            row["thread_reader_mismatches"] = max(run["thread_reader_mismatches"] for run in rs)
        out[variant] = row
    return out


def table(summary: dict[str, Any], batches: int) -> str:
    lines = [
        "| variant | ms/batch min / median (spread) | vs no upload, paired median | "
        "hidden (as `trainbus demo`) | thread reader saw a later batch's weights |",
        "|---|---|---|---|---|",
    ]
    for variant, row in summary.items():
        paired = (f"{row['diff_median']:+.2f} ms ({row['ratio_median']:.2f}x)"
                  if variant != "no upload" else "-")
        hidden = f"{row['hidden_median']:.0%}" if "hidden_median" in row else "-"
        lag = (f"{row['thread_reader_mismatches']} of {batches} batches"
               if "thread_reader_mismatches" in row else "-")
        lines.append(f"| {variant} | {row['min']:.2f} / {row['median']:.2f} "
                     f"({row['spread']:.2f}) | {paired} | {hidden} | {lag} |")
    return "\n".join(lines)


def cpu_table(summary: dict[str, Any]) -> str:
    lines = [
        "| per batch, median | " + " | ".join(CPU_COLUMNS.values()) + " |",
        "|---|" + "---|" * len(CPU_COLUMNS),
    ]
    for variant, row in summary.items():
        cells = [
            "-" if key not in row or math.isnan(row[key])
            else f"{row[key]:.2f}" if key == "train_vcsw" else f"{row[key]:.2f} ms"
            for key in CPU_COLUMNS
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--batch-ms", type=float, default=10.0,
                        help="CPU ms per plain-loop batch to calibrate the MLP to")
    parser.add_argument("--hidden", type=int, help="hidden width (skips calibration)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--switch-interval-ms", type=float,
                        help="sys.setswitchinterval for the whole run (CPython's is 5 ms)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.rounds < 1 or args.batches < 3:
        parser.error("--rounds must be >= 1 and --batches >= 3")
    torch.set_num_threads(args.threads)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    hidden = args.hidden or calibrate(args.batch_ms)
    started = time.perf_counter()
    runs = anyio.run(bench, args.rounds, args.batches, hidden)
    summary = summarize(runs)
    for variant in LOCKSTEP_READER:
        assert summary[variant]["thread_reader_mismatches"] == 0, (variant, summary[variant])
    extra = summary["trailing(2)"]["diff_median"]
    verdict = "met" if extra <= 0.5 else "**missed**"
    text = table(summary, args.batches)
    cpu = cpu_table(summary)
    first = runs["trailing(2)"][0]
    conditions = (
        f"MLP 512-{hidden}-10, batch {BATCH}, {args.batches} batches x {args.rounds} rounds, "
        f"torch {torch.__version__} with {first['torch_threads']} intra-op thread(s) on the "
        f"training thread, switch interval {sys.getswitchinterval() * 1e3:g} ms, "
        f"{first['connections']:g} connection(s) for {first['requests']:g} POSTs per run, "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(text, "", cpu, "", conditions, sep="\n")
    print(
        f"trailing(2) over no upload: {extra:+.2f} ms/batch wall (target <= +0.5 ms: "
        f"{verdict}), {summary['trailing(2)']['cpu_diff_median']:+.2f} ms/batch training-thread "
        f"CPU; upload {LATENCY_MS:g} ms/batch at the server"
    )
    if args.json:
        args.json.write_text(json.dumps({
            "summary": summary, "runs": runs, "table": text, "cpu_table": cpu,
            "conditions": conditions, "verdict": verdict, "hidden": hidden,
        }))


if __name__ == "__main__":
    main()
