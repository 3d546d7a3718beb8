"""Scenario (g): a 5 ms upload awaited at ``BATCH_END``, lockstep vs ``@trailing(2)`` vs ``max_lag=2``.

Workload: MLP 512-2048-10, batch 128, one torch thread, SGD, CPU (about 10 ms a batch on
the 2-core benchmark machine). Every trainbus run has two weight readers: a ``@blocking``
``batch_end`` (on the training thread: the weights of its batch, by construction) and a
plain ``def batch_end`` on its own thread, which sees the weights of its batch only if
the ``BATCH_END`` barrier still waits for it. Variants:

- ``no upload``: those readers only (the baseline the others are compared with);
- ``lockstep``: plus an ``async def batch_end`` that awaits one httpx POST to a local
  server answering after 5 ms (``latency_server.py``, in its own process);
- ``trailing(2)``: the same handler declared ``@trainbus.trailing(2)``;
- ``max_lag=2``: the undecorated handler with ``Trainer(max_lag=2)`` (every callback trails);
- ``plain loop``: a hand-written torch loop, no trainbus, for reference.

Rounds are interleaved (each round runs every variant once, in a rotated order) after
one untimed warm-up round; per variant: min / median / spread (max - min) of ms/batch,
and the median of the per-round paired differences and ratios against ``no upload`` in
the same round. ``hidden`` is the demo's figure (``trainbus demo``):
``1 - (waited at barriers and queues + drain after FIT_END) / handler time``, from
``engine.statistics()`` (``trainbus._demo.exposure``). The script asserts that the
thread reader saw the weights of its batch in every lockstep and ``trailing(2)`` run.

Run:  python benchmarks/bench_trailing.py [--rounds 7] [--batches 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import torch

import trainbus
from trainbus._demo import exposure

DIMS = (512, 2048, 10)
BATCH = 128
LATENCY_MS = 5.0
VARIANTS = ("plain loop", "no upload", "lockstep", "trailing(2)", "max_lag=2")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DIMS[0], DIMS[1]), torch.nn.ReLU(), torch.nn.Linear(DIMS[1], DIMS[2])
    )


def make_data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, DIMS[0], generator=g), torch.randint(0, DIMS[2], (BATCH,), generator=g))
        for _ in range(n)
    ]


def checksum(model: torch.nn.Module) -> float:
    return float(model[0].weight.detach().sum())


class TruthReader(trainbus.Callback):
    """``@blocking``: on the training thread, the weights right after this batch's step."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    @trainbus.blocking
    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)


class ThreadReader(trainbus.Callback):
    """A plain handler on its own thread: lockstep only while the barrier waits for it."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def batch_end(self, state: Any, logger: Any) -> None:
        self.seen[int(state.timer.batch)] = checksum(state.model)


class Upload(trainbus.Callback):
    """Awaits one POST per batch (the README's handler)."""

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


class FitEndClock(trainbus.Callback):
    def __init__(self) -> None:
        self.ended_at = 0.0

    @trainbus.blocking
    def fit_end(self, state: Any, logger: Any) -> None:
        self.ended_at = time.perf_counter()


def plain_loop(data: list[Any]) -> float:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return (time.perf_counter() - start) * 1e3 / len(data)


async def trainbus_run(variant: str, data: list[Any], url: str) -> dict[str, Any]:
    truth, reader, clock = TruthReader(), ThreadReader(), FitEndClock()
    callbacks: list[trainbus.Callback] = [truth, reader, clock]
    upload: Upload | None = None
    if variant != "no upload":
        upload = TrailingUpload(url) if variant == "trailing(2)" else Upload(url)
        callbacks.append(upload)
    model = make_model()
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
    start = time.perf_counter()
    await trainer.fit()
    returned = time.perf_counter()
    work, waited, hidden = exposure(trainer.engine.statistics(), returned - clock.ended_at)
    mismatched = sum(reader.seen[b] != truth.seen[b] for b in truth.seen)
    assert upload is None or upload.sent == len(data)
    return {
        "ms": (returned - start) * 1e3 / len(data),
        "work_s": work,
        "exposed_s": work - hidden,
        "hidden": hidden / work if work > 0 else 0.0,
        "thread_reader_mismatches": mismatched,
        "waited_s": waited,
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


async def bench(rounds: int, batches: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    data = make_data(batches)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with latency_server() as url:
        for r in range(rounds + 1):  # round 0: warm-up, not kept
            order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
            for variant in order:
                gc.collect()
                if variant == "plain loop":
                    run = {"ms": plain_loop(data)}
                else:
                    run = await trainbus_run(variant, data, url)
                if r:
                    runs[variant].append(run)
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    base = [run["ms"] for run in runs["no upload"]]
    plain = [run["ms"] for run in runs["plain loop"]]
    out: dict[str, Any] = {}
    for variant, rs in runs.items():
        ms = [run["ms"] for run in rs]
        diffs = [m - b for m, b in zip(ms, base, strict=True)]
        ratios = [m / b for m, b in zip(ms, base, strict=True)]
        row: dict[str, Any] = {
            "min": min(ms),
            "median": statistics.median(ms),
            "spread": max(ms) - min(ms),
            "diff_median": statistics.median(diffs),
            "ratio_median": statistics.median(ratios),
            "vs_plain_median": statistics.median(m - p for m, p in zip(ms, plain, strict=True)),
        }
        if "hidden" in rs[0] and variant != "no upload":
            row["hidden_median"] = statistics.median(run["hidden"] for run in rs)
        if "thread_reader_mismatches" in rs[0]:
            row["thread_reader_mismatches"] = max(run["thread_reader_mismatches"] for run in rs)
        out[variant] = row
    return out


def table(summary: dict[str, Any], batches: int) -> str:
    lines = [
        "| variant | ms/batch min / median (spread) | vs no upload, paired median | "
        "vs plain loop, paired median | hidden (as `trainbus demo`) | "
        "thread reader saw a later batch's weights |",
        "|---|---|---|---|---|---|",
    ]
    for variant, row in summary.items():
        paired = (
            f"{row['diff_median']:+.2f} ms ({row['ratio_median']:.2f}x)"
            if variant != "no upload"
            else "-"
        )
        hidden = f"{row['hidden_median']:.0%}" if "hidden_median" in row else "-"
        lag = (
            f"{row['thread_reader_mismatches']} of {batches} batches"
            if "thread_reader_mismatches" in row
            else "-"
        )
        lines.append(
            f"| {variant} | {row['min']:.2f} / {row['median']:.2f} ({row['spread']:.2f}) "
            f"| {paired} | {row['vs_plain_median']:+.2f} ms | {hidden} | {lag} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = anyio.run(bench, args.rounds, args.batches)
    summary = summarize(runs)
    for variant in ("no upload", "lockstep", "trailing(2)"):
        assert summary[variant]["thread_reader_mismatches"] == 0, (variant, summary[variant])
    extra = summary["trailing(2)"]["diff_median"]
    verdict = "met" if extra <= 0.5 else "**missed**"
    text = table(summary, args.batches)
    print(text)
    load = os.getloadavg()[0]
    print(
        f"trailing(2) over no upload: {extra:+.2f} ms/batch (target <= +0.5 ms: {verdict}); "
        f"upload {LATENCY_MS:g} ms/batch at the server; load average {load:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "runs": runs, "table": text, "verdict": verdict})
        )


if __name__ == "__main__":
    main()
