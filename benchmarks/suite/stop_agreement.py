"""Every rank stops at the same batch: what the agreement costs the training thread a batch.

Two processes under ``torchrun`` (gloo, CPU) train a small DDP model by hand and run
``StopAgreement.step`` after each batch, as the Trainer does (``docs/preemption.md``): the
wait for the ``all_reduce`` started at the boundary before and the start of this
boundary's. Wall clock of that call on rank 0's training thread, the median over the
batches of one launch; each round is a fresh launch. Reported with the batch's own time
beside it. No target in SPEC: the figure says what the agreement costs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import stats
from harness.runner import Context, env_for

FIGURE = "stop agreement across 2 ranks (gloo; wall on the training thread per batch)"
WORKER = Path(__file__).with_name("_stop_agreement_rank.py")


def launch(batches: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", str(WORKER), str(batches)]  # fmt: skip
    proc = subprocess.run(cmd, env=env_for("trainbus_fw"), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"the 2-rank launch failed:\n{proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    result: dict[str, float] = json.loads(line)
    return result


def run(ctx: Context) -> list[dict[str, Any]]:
    batches = 200 if ctx.quick else 1000
    rounds = [launch(batches) for _ in range(3 if ctx.quick else 5)]
    step = stats.summarize([r["step"] * 1e6 for r in rounds])
    batch = stats.summarize([r["batch"] * 1e6 for r in rounds])
    return [stats.row(
        FIGURE, "no target (what it costs)",
        f"{step.median:.0f} µs a batch ({step.min:.0f}-{step.max:.0f}, {len(rounds)} launches "
        f"of {batches} batches); the whole batch {batch.median:.0f} µs",
        "no target", unit="us", step=step.as_dict(), batch=batch.as_dict(),
    )]
