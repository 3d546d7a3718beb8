"""(g) A 5 ms awaited POST per batch (httpx, to a local server in its own process) from an
``@trailing(2)`` ``async def batch_end``, on a ~10 ms batch (the ``g10`` workload); wall
clock, ratio to the same loop without the upload, paired round by round, in one process."""

from __future__ import annotations

import time
from typing import Any

from harness import stats
from harness.runner import Context, latency_server

FIGURE = "(g) a 5 ms awaited POST per batch from an `@trailing(2)` `async def` handler on a ~10 ms batch"
TARGET = 1.10


def measure(url: str, batches: int, rounds: int) -> dict[str, list[float]]:
    import anyio
    import httpx
    from harness import workload as wl
    from harness.frameworks.trainbus_fw import fit_in_loop

    import trainbus

    class Upload(trainbus.Callback):
        def __init__(self) -> None:
            self.client = httpx.AsyncClient()

        @trainbus.trailing(2)
        async def batch_end(self, state: Any, logger: Any) -> None:
            await self.client.post(url, json={"batch": int(state.timer.batch)})

        async def close(self, state: Any, logger: Any) -> None:
            await self.client.aclose()

    w = wl.make_workload("g10", batches)
    out: dict[str, list[float]] = {"upload": [], "none": []}

    async def epoch(arm: str) -> float:
        data = wl.TimedBatches(w.batches)
        await fit_in_loop(w, [Upload()] if arm == "upload" else [], data)
        assert data.t_first is not None
        return (time.perf_counter() - data.t_first) * 1e3 / len(data)

    async def main() -> None:
        await epoch("upload")  # warm-up
        for r in range(rounds):
            for arm in (("upload", "none") if r % 2 else ("none", "upload")):
                out[arm].append(await epoch(arm))

    anyio.run(main)
    return out


def run(ctx: Context) -> list[dict[str, Any]]:
    with latency_server(5) as url:
        times = ctx.child("trailing_upload", url=url, batches=20 if ctx.quick else 100,
                          rounds=ctx.rounds)
    s = stats.paired(times["upload"], times["none"])
    base = stats.summarize(times["none"])
    return [stats.row(FIGURE + " (ratio to the loop without the upload)", f"<= {TARGET:.2f}x",
                      f"trainbus {s.median:.2f}x ({s.min:.2f}-{s.max:.2f}); the batch "
                      f"without the upload {base.median:.1f} ms",
                      stats.verdict(s.median, s.spread, TARGET), unit="ratio",
                      ratio=s.as_dict(), **times)]
