"""Each rank's step time gathered beside training: what it costs the training thread a batch.

Instructions (callgrind) of the calls the loop makes at each batch boundary of a distributed
fit, on the training thread: ``RankTimes`` (two clock reads and a few additions a batch,
and every 100 batches the wait for the last ``all_gather`` and the start of the next) beside
``StopAgreement.step`` (the wait for the last ``all_reduce`` and the start of the next, every
batch). One process with a gloo group of one rank (``suite/_rank_times_count.py``): the
collectives' threads and the peers are not on the training thread. No target in SPEC but
"no stall per batch": the figure says what the gathering costs.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import stats
from harness.runner import BENCH, Context, _totals, env_for, python_for

FIGURE = "per-rank step-time gathering (training-thread instructions per batch, beside the stop agreement's)"


def count(n: int) -> dict[str, float]:
    """Per call of each, on the calling thread: (the 2n dump - the n dump) / n."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
               f"--callgrind-out-file={out}", str(python_for("trainbus_fw")), "-m",
               "suite._rank_times_count", str(n)]  # fmt: skip
        proc = subprocess.run(cmd, cwd=BENCH, env=env_for("trainbus_fw"), capture_output=True,
                              text=True, timeout=1500, check=False)  # fmt: skip
        if proc.returncode:
            raise RuntimeError(f"callgrind of the rank times failed:\n{proc.stderr[-3000:]}")
        main = {int(p.name.split(".")[-1].split("-")[0]): _totals(p)[0]
                for p in Path(tmp).glob("cg.out.*-01")}  # fmt: skip
    return {"rank_times": (main[2] - main[1]) / n, "stop_agreement": (main[4] - main[3]) / n}


def run(ctx: Context) -> list[dict[str, Any]]:
    n = 500 if ctx.quick else 2000
    figures = count(n)
    return [stats.row(
        FIGURE, "no target (no stall per batch: overlapped)",
        f"{figures['rank_times']:,.0f} instructions a batch (every 100th waits for the last "
        f"gathering and starts the next); the stop agreement's step "
        f"{figures['stop_agreement']:,.0f} (n={n} boundaries, one process, gloo)",
        "no target", unit="instructions per batch", **figures, n=n,
    )]
