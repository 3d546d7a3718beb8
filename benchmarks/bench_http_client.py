"""What one POST costs the event loop's thread, per HTTP client configuration (scenario (g)).

In scenario (g) (``bench_trailing.py``) a ``@trailing(2)`` upload costs the training thread
nothing in waiting, but the client's Python work runs on the event loop's thread and holds
the GIL while it does. This measures that work alone, with no training: one client awaits
``--posts`` POSTs in a row (``{"batch": n}`` as JSON, one kept-alive connection) to
``latency_server.py`` (its own process) answering after ``--latency-ms`` (5) ms, and the loop
thread's CPU time (``time.thread_time()``, which does not depend on the machine's load) is
divided by the POSTs; wall time per POST and CPython's generation-0 garbage collections per
POST (they run on whichever thread allocates: in a training run, some on the training
thread) beside it. Rows (interleaved rounds after a warm-up round; min / median / max over
rounds and the median of per-round paired ratios against ``httpx default``):

- ``httpx default``: ``httpx.AsyncClient()``, ``await client.post(url, json=payload)``
  (the README's handler);
- ``httpx trust_env=False``: no proxy or ``.netrc`` lookups from the environment;
- ``httpx content=bytes``: ``json.dumps`` by hand and ``content=``/``headers=``;
- ``httpx timeout=None``: the client built with ``timeout=None`` (no deadline per read);
- ``httpx limits=1``: ``httpx.Limits(max_connections=1, max_keepalive_connections=1)``;
- ``httpx no logging``: ``logging.disable(logging.INFO)`` around the run (httpx logs every
  response at INFO);
- ``httpx built request``: one ``httpx.Request`` built once, ``await client.send(request)``
  (a fixed body: an upload that sends the same bytes every time);
- ``httpx Request per POST``: ``trust_env=False`` and a new ``httpx.Request`` per POST (the
  URL parsed once, the client's timeout passed as its extension), ``client.send(request)``:
  what a real upload with a new body per batch can do;
- ``httpx all of the above``: trust_env=False, timeout=None, the built request, no logging;
- ``httpcore pool``: httpx's own transport (``httpcore.AsyncConnectionPool``) called
  directly: what httpx adds on top of it;
- ``raw client``: :class:`upload_server.RawClient`, a hand-written HTTP/1.1 client on one
  anyio stream (the floor for a Python client on this loop);
- ``sleep``: ``await anyio.sleep(5 ms)`` and no request: the loop's own wake-up cost.

``--backend trio`` runs the same rows on trio (``asyncio`` by default).

Instruction counts (they do not depend on load): ``--once ROW --posts N`` under
``valgrind --tool=callgrind`` with two values of N; the difference of the two totals over
the difference of the Ns is the instructions per POST, start-up excluded::

    for n in 50 250; do PYTHONPATH=src valgrind --tool=callgrind \
        --callgrind-out-file=/tmp/cg.$n python benchmarks/bench_http_client.py \
        --once "httpx default" --posts $n; done

Run:  PYTHONPATH=src python benchmarks/bench_http_client.py [--posts 200] [--rounds 5]
      [--latency-ms 5] [--backend asyncio|trio] [--rows "httpx default,raw client"]
      [--profile "httpx default"]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpcore
import httpx
from upload_server import RawClient, latency_server

Post = Callable[[int], Awaitable[None]]
Close = Callable[[], Awaitable[None]]


def _httpx(url: str, *, how: str = "json", **options: Any) -> tuple[Post, Close]:
    client = httpx.AsyncClient(**options)
    headers = {"Content-Type": "application/json"}
    request = client.build_request("POST", url, content=b'{"batch": 0}', headers=headers)
    target, timeout = httpx.URL(url), {"timeout": client.timeout.as_dict()}

    async def post(n: int) -> None:
        if how == "json":
            response = await client.post(url, json={"batch": n})
        elif how == "content":
            body = json.dumps({"batch": n}).encode()
            response = await client.post(url, content=body, headers=headers)
        elif how == "new request":  # httpx.Request per POST: no merging with the client's
            body = json.dumps({"batch": n}).encode()
            new = httpx.Request("POST", target, content=body, headers=headers, extensions=timeout)
            response = await client.send(new)
        else:  # the request built once (its body does not change here)
            json.dumps({"batch": n}).encode()
            response = await client.send(request)
        response.raise_for_status()

    return post, client.aclose


def _httpcore(url: str) -> tuple[Post, Close]:
    pool = httpcore.AsyncConnectionPool()
    headers = [(b"Content-Type", b"application/json")]

    async def post(n: int) -> None:
        body = json.dumps({"batch": n}).encode()
        response = await pool.request("POST", url, headers=headers, content=body)
        if response.status != 200:
            raise RuntimeError(response.status)

    return post, pool.aclose


def _raw(url: str) -> tuple[Post, Close]:
    client = RawClient(url)

    async def post(n: int) -> None:
        await client.post(json.dumps({"batch": n}).encode())

    return post, client.aclose


def _sleep(url: str) -> tuple[Post, Close]:
    async def post(n: int) -> None:
        json.dumps({"batch": n}).encode()
        await anyio.sleep(0.005)

    async def close() -> None:
        pass

    return post, close


ROWS: dict[str, Callable[[str], tuple[Post, Close]]] = {
    "httpx default": lambda url: _httpx(url),
    "httpx trust_env=False": lambda url: _httpx(url, trust_env=False),
    "httpx content=bytes": lambda url: _httpx(url, how="content"),
    "httpx timeout=None": lambda url: _httpx(url, timeout=None),
    "httpx limits=1": lambda url: _httpx(
        url, limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)
    ),
    "httpx no logging": lambda url: _httpx(url),
    "httpx built request": lambda url: _httpx(url, how="request"),
    "httpx Request per POST": lambda url: _httpx(url, how="new request", trust_env=False),
    "httpx all of the above": lambda url: _httpx(
        url, how="request", trust_env=False, timeout=None
    ),
    "httpcore pool": _httpcore,
    "raw client": _raw,
    "sleep": _sleep,
}
QUIET = ("httpx no logging", "httpx all of the above")


@contextlib.contextmanager
def _logging_off(row: str) -> Iterator[None]:
    if row in QUIET:
        logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


async def one_row(row: str, url: str, posts: int) -> dict[str, float]:
    """``posts`` POSTs in a row with ``row``'s client: loop CPU, wall and gen-0 GCs per POST."""
    post, close = ROWS[row](url)
    with _logging_off(row):
        await post(-1)  # connect outside the measurement
        gc.collect()
        gen0 = gc.get_stats()[0]["collections"]
        usage0 = resource.getrusage(resource.RUSAGE_THREAD)
        cpu, wall = time.thread_time(), time.perf_counter()
        for n in range(posts):
            await post(n)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        gcs = gc.get_stats()[0]["collections"] - gen0
    await close()
    return {"cpu_us": cpu * 1e6 / posts, "wall_ms": wall * 1e3 / posts, "gc0": gcs / posts,
            "user_us": (usage.ru_utime - usage0.ru_utime) * 1e6 / posts,
            "sys_us": (usage.ru_stime - usage0.ru_stime) * 1e6 / posts}


async def bench(rows: list[str], url: str, posts: int, rounds: int) -> dict[str, list[Any]]:
    runs: dict[str, list[Any]] = {row: [] for row in rows}
    for r in range(rounds + 1):  # round 0: warm-up, not kept
        order = rows[r % len(rows):] + rows[: r % len(rows)]
        for row in order:
            run = await one_row(row, url, posts)
            if r:
                runs[row].append(run)
    return runs


def report(runs: dict[str, list[Any]]) -> str:
    base = [run["cpu_us"] for run in next(iter(runs.values()))]
    first = next(iter(runs))
    lines = [
        f"| client | loop CPU µs/POST min / median / max | vs {first}, paired median | "
        "user / sys µs/POST median | wall ms/POST median | gen-0 GCs per POST |",
        "|---|---|---|---|---|---|",
    ]
    for row, rs in runs.items():
        cpu = [run["cpu_us"] for run in rs]
        ratio = statistics.median(c / b for c, b in zip(cpu, base, strict=True))
        lines.append(
            f"| {row} | {min(cpu):.0f} / {statistics.median(cpu):.0f} / {max(cpu):.0f} | "
            f"{ratio:.2f}x | {statistics.median(run['user_us'] for run in rs):.0f} / "
            f"{statistics.median(run['sys_us'] for run in rs):.0f} | "
            f"{statistics.median(run['wall_ms'] for run in rs):.2f} | "
            f"{statistics.median(run['gc0'] for run in rs):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--posts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--rows", help="comma-separated rows (default: all)")
    parser.add_argument("--profile", choices=list(ROWS),
                        help="cProfile one row (--posts POSTs) and print the top functions")
    parser.add_argument("--once", choices=list(ROWS),
                        help="one row, --posts POSTs, once (for valgrind: see the docstring)")
    parser.add_argument("--sort", default="tottime", help="--profile's order (pstats key)")
    parser.add_argument("--top", type=int, default=25, help="--profile's functions shown")
    args = parser.parse_args()
    rows = args.rows.split(",") if args.rows else list(ROWS)
    if unknown := [row for row in rows if row not in ROWS]:
        parser.error(f"--rows: unknown {unknown}; choose from {list(ROWS)}")
    if args.posts < 1 or args.rounds < 1:
        parser.error("--posts and --rounds must be >= 1")
    with latency_server(args.latency_ms) as url:
        if args.once:
            print(anyio.run(one_row, args.once, url, args.posts, backend=args.backend))
            return
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            anyio.run(one_row, args.profile, url, args.posts, backend=args.backend)
            profiler.disable()
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)
            return
        started = time.perf_counter()
        runs = anyio.run(bench, rows, url, args.posts, args.rounds, backend=args.backend)
    print(report(runs))
    print(f"\n{args.posts} POSTs x {args.rounds} rounds, server latency {args.latency_ms:g} ms, "
          f"{args.backend}, httpx {httpx.__version__}, httpcore {httpcore.__version__}, "
          f"load average {__import__('os').getloadavg()[0]:.2f}, "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
