"""The two-process DDP check behind ``scripts/gpu_check.py --ddp`` (issue 16).

It launches ``tests/distributed_scripts/ddp_train.py`` with ``python -m torch.distributed.run
--standalone --nproc_per_node=2`` three times, as ``tests/test_distributed.py`` does on the
CPU, and checks:

1. ``train``: each rank trains on 4 of the 8 samples per epoch (disjoint), parameters and
   eval metrics are identical across ranks, only rank zero wrote the JSON-lines file and the
   checkpoints;
2. ``resume``: two ranks resume from rank zero's epoch-1 checkpoint and end with the
   uninterrupted run's parameters;
3. ``fail``: an exception on rank 1 makes torchrun exit non-zero within 60 s with the error
   visible, and both ranks ran their callbacks' close.

On CUDA the ranks use ``cpu:gloo,cuda:nccl`` on ``cuda:0`` and ``cuda:1``: NCCL needs one
GPU per rank, so with fewer than two GPUs the check is skipped with that reason.

Usage::

    python scripts/gpu_check.py --ddp          # CUDA (two GPUs or more)
    python scripts/gpu_check.py --ddp --cpu    # the same check with gloo on the CPU
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["run_ddp_check"]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_scripts" / "ddp_train.py"


def _launch(out: Path, device: str, *args: str) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPT), str(out), "--device", device, *args,
    ]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        return -1, f"timed out after 180 s: {exc}", time.monotonic() - start
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _report(name: str, ok: bool, detail: str = "") -> bool:
    print(f"  {name}: {'PASS' if ok else 'FAIL'}{' ' + detail if detail and not ok else ''}")
    return ok


def run_ddp_check(cpu: bool) -> int:
    """Run the three launches; print PASS/FAIL lines; 0 when all pass (or skipped)."""
    if not cpu:
        if not torch.cuda.is_available():
            print("gpu_check --ddp skipped: CUDA is not available here (use --cpu for gloo)")
            return 0
        if torch.cuda.device_count() < 2:
            print(
                f"gpu_check --ddp skipped: NCCL needs one GPU per rank and this machine has "
                f"{torch.cuda.device_count()}; run it on a machine with two GPUs or more"
            )
            return 0
    device = "cpu" if cpu else "cuda"
    print(f"DDP check, 2 ranks on {device} ({'gloo' if cpu else 'cpu:gloo,cuda:nccl'}):")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        train, resume, fail = Path(tmp, "train"), Path(tmp, "resume"), Path(tmp, "fail")
        rc, out, _ = _launch(train, device, "--mode", "train")
        if not _report("train", rc == 0, out[-2000:]):
            return 1
        r0, r1 = _ranks(train)
        halves = all(
            len(r0["seen"][e]) == len(r1["seen"][e]) == 4
            and sorted(r0["seen"][e] + r1["seen"][e]) == list(range(8))
            for e in (0, 1)
        )
        ok &= _report("each rank trains on its half (4 of 8)", halves, str(r0["seen"]))
        same = r0["params"] == r1["params"] and r0["eval"] == r1["eval"]
        ok &= _report("parameters and eval metrics identical across ranks", same)
        files = sorted(p.name for p in train.iterdir())
        only_zero = "metrics-rank1.jsonl" not in files and sorted(
            p.name for p in (train / "ckpt").iterdir()
        ) == ["ep1-ba4-rank0.pt", "ep2-ba8-rank0.pt"]
        ok &= _report("only rank zero writes logs and checkpoints", only_zero, str(files))
        ckpt = train / "ckpt" / "ep1-ba4-rank0.pt"
        rc, out, _ = _launch(resume, device, "--mode", "resume", "--load", str(ckpt))
        resumed = rc == 0 and all(
            torch.allclose(torch.tensor(a["params"][k]), torch.tensor(b["params"][k]), rtol=1e-6)
            for a, b in zip(_ranks(resume), (r0, r1), strict=True)
            for k in a["params"]
        )
        ok &= _report("two ranks resume from rank zero's checkpoint", resumed, out[-2000:])
        rc, out, elapsed = _launch(fail, device, "--mode", "fail")
        failed = rc != 0 and "boom on rank 1 at batch 2" in out and elapsed < 60
        closed = failed and [r["rank"] for r in _ranks(fail)] == [0, 1]
        ok &= _report(
            f"an exception on rank 1 stops both ranks (exit {rc}, {elapsed:.1f} s)",
            closed,
            out[-3000:],
        )
    print("RESULT:", "OK" if ok else "FAILED (see above)")
    return 0 if ok else 1
