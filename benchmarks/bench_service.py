"""Service responsiveness: ``GET /healthz`` latency while two jobs train, against idle.

The trainbus service (``trainbus.serve``: Starlette under uvicorn, the demo MLP job) runs
in a subprocess, as it would in production; this process is the client. It measures the
round-trip latency of ``GET /healthz`` (sequential requests on one keep-alive connection,
a short pause between them) in phases, side by side in one run:

    idle          no job
    2 jobs        two jobs training (each on its own training thread)
    2 jobs + SSE  the same, with one SSE client following each job's event stream

Each phase reports p50 / p99 / max latency in ms, and the training phases the batches per
second both jobs made together (read from ``GET /jobs/{id}``). SPEC section 6 asks for
request latency during training within a few ms of idle.

Run:  python benchmarks/bench_service.py [--requests 2000] [--hidden 512] [--batch-size 64]
      [--torch-threads 1] [--gap-ms 2] [--switch-interval 0.001]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def serve(port_file: str, torch_threads: int, switch_interval: float | None) -> None:
    """The server process: the service on a free port, written to ``port_file``."""
    import asyncio

    import torch

    from trainbus.serve import create_app, create_server

    torch.set_num_threads(torch_threads)
    if switch_interval:
        sys.setswitchinterval(switch_interval)
    server = create_server(create_app(), port=0, log_level="warning")

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        await server.ready.wait()
        Path(port_file).write_text(str(server.port))
        await task

    asyncio.run(main())


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(tempfile.mkdtemp()) / "port"
    command = [sys.executable, __file__, "--serve", str(port_file)]
    command += ["--torch-threads", str(args.torch_threads)]
    if args.switch_interval:
        command += ["--switch-interval", str(args.switch_interval)]
    proc = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


def measure(client: httpx.Client, n: int, gap: float) -> list[float]:
    """``n`` sequential ``GET /healthz`` round trips, in ms."""
    for _ in range(20):  # warm the connection
        client.get("/healthz")
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get("/healthz")
        out.append((time.perf_counter() - t0) * 1e3)
        r.raise_for_status()
        time.sleep(gap)
    return out


def follow(url: str, job_id: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """An SSE client reading a job's stream (in a thread of this process)."""
    with (
        httpx.Client(base_url=url, timeout=None) as c,
        c.stream("GET", f"/jobs/{job_id}/events") as r,
    ):
        for line in r.iter_lines():
            if line.startswith("event:"):
                counts[job_id] = counts.get(job_id, 0) + 1
            if stop.is_set():
                return


def batches(client: httpx.Client, ids: list[str]) -> int:
    return sum(client.get(f"/jobs/{i}").json()["progress"]["batch"] for i in ids)


def training_phase(
    client: httpx.Client, url: str, args: argparse.Namespace, sse: bool
) -> tuple[list[float], float, int]:
    params = {"batches": 10_000_000, "epochs": 1, "eval_batches": 0}
    params |= {"hidden": args.hidden, "batch_size": args.batch_size}
    ids = [client.post("/jobs", json=params).json()["id"] for _ in range(2)]
    stop = threading.Event()
    counts: dict[str, int] = {}
    readers = [
        threading.Thread(target=follow, args=(url, i, stop, counts), daemon=True)
        for i in (ids if sse else [])
    ]
    for t in readers:
        t.start()
    while batches(client, ids) < 50:  # both jobs past start-up
        time.sleep(0.05)
    b0, t0 = batches(client, ids), time.perf_counter()
    lat = measure(client, args.requests, args.gap_ms / 1e3)
    rate = (batches(client, ids) - b0) / (time.perf_counter() - t0)
    for i in ids:
        assert client.delete(f"/jobs/{i}").json()["status"] == "cancelled"
    stop.set()
    for t in readers:
        t.join(timeout=10)
    return lat, rate, sum(counts.values())


def row(name: str, lat: list[float], rate: float | None, extra: str = "") -> str:
    q = statistics.quantiles(lat, n=100)
    rate_s = f"{rate:,.0f}" if rate is not None else "-"
    return f"| {name:<13} | {q[49]:6.2f} | {q[98]:6.2f} | {max(lat):7.2f} | {rate_s:>10} |{extra}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval() in the server process (default: Python's 0.005 s)",
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.torch_threads, args.switch_interval)
        return

    proc, url = start_server(args)
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            idle = measure(client, args.requests, args.gap_ms / 1e3)
            busy, rate, _ = training_phase(client, url, args, sse=False)
            busy_sse, rate_sse, events = training_phase(client, url, args, sse=True)
            idle_after = measure(client, args.requests, args.gap_ms / 1e3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    print(
        f"GET /healthz latency (ms), {args.requests} requests per phase, {args.gap_ms} ms apart;"
        f" jobs: demo MLP 16-{args.hidden}-4, batch {args.batch_size}, "
        f"{args.torch_threads} torch thread(s); GIL switch interval "
        f"{args.switch_interval or sys.getswitchinterval()} s; {os.cpu_count()} CPUs\n"
    )
    print("| phase         |    p50 |    p99 |     max | batches/s  |")
    print("|---------------|--------|--------|---------|------------|")
    print(row("idle", idle, None))
    print(row("2 jobs", busy, rate))
    print(row("2 jobs + SSE", busy_sse, rate_sse, f" {events} SSE events read"))
    print(row("idle again", idle_after, None))
    summary = {
        "idle_p99": statistics.quantiles(idle, n=100)[98],
        "busy_p99": statistics.quantiles(busy, n=100)[98],
        "busy_sse_p99": statistics.quantiles(busy_sse, n=100)[98],
    }
    print("\n" + json.dumps({k: round(v, 3) for k, v in summary.items()}))


if __name__ == "__main__":
    main()
