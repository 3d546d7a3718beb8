"""The multi-process check behind ``scripts/gpu_check.py --ddp`` (issue 16).

It launches ``tests/distributed_scripts/ddp_train.py`` and ``fsdp_train.py`` with
``python -m torch.distributed.run --standalone --nproc_per_node=N`` and checks what
``tests/test_distributed.py`` and ``tests/test_fsdp.py`` check on the CPU:

- **DDP, two ranks** (``train``, ``resume``, ``fail``): each rank trains on 4 of the 8
  samples per epoch (disjoint), parameters and eval metrics are identical across ranks,
  only rank zero writes the JSON-lines file and the checkpoints; two ranks resume from
  rank zero's epoch-1 checkpoint and end with the uninterrupted run's parameters; an
  exception on rank 1 makes torchrun exit non-zero within 60 s with the error visible,
  and both ranks ran their callbacks' close;
- **DDP, one rank over NCCL** (CUDA): a real NCCL process group and a model the script
  wrapped in ``DistributedDataParallel`` on the GPU; it trains, checkpoints and resumes;
- **FSDP** (``fully_shard``): every rank writes its shards of each
  ``torch.distributed.checkpoint`` folder (``.metadata`` present), and a resume from the
  mid-epoch checkpoint ``ep1-ba6`` ends with the uninterrupted run's model and optimizer.

What runs depends on the machine (:func:`plan`):

- ``--cpu``: DDP and FSDP with 2 ranks over gloo;
- one GPU: DDP with 2 ranks both on ``cuda:0`` over gloo (NCCL needs a GPU per rank) and
  with 1 rank over NCCL; FSDP with 1 rank (``cpu:gloo,cuda:nccl``) and with 2 ranks both on
  ``cuda:0`` over gloo;
- two GPUs or more: DDP and FSDP with 2 ranks, ``cpu:gloo,cuda:nccl``.

Usage (from the repository root; about a minute on a GPU machine, 2-3 on two CPU cores)::

    PYTHONPATH=src python scripts/gpu_check.py --ddp        # CUDA
    PYTHONPATH=src python scripts/gpu_check.py --ddp --cpu  # gloo on the CPU

It prints a PASS/FAIL line per check and ``RESULT: OK`` or ``RESULT: FAILED``; the exit
status is 1 when a check failed, 0 when all passed (or CUDA is missing without ``--cpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = ["Check", "plan", "run_ddp_check"]

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "distributed_scripts"
LAUNCH_TIMEOUT = 90  # a launch trains for seconds; a hang fails its check, not the whole run


def _launch(script: str, out: Path, nproc: int, *args: str) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", str(SCRIPTS / script), str(out), *args,
    ]  # fmt: skip
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        return -1, f"timed out after {LAUNCH_TIMEOUT} s: {exc}", time.monotonic() - start
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _ranks(out: Path, nproc: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def _report(name: str, ok: bool, detail: str = "") -> bool:
    verdict = "PASS" if ok else "FAIL"
    print(f"  {name}: {verdict}{' ' + detail if detail and not ok else ''}", flush=True)
    return ok


def _close(a: Any, b: Any) -> bool:
    """Nested lists/dicts of numbers equal within float tolerance."""
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return ta.shape == tb.shape and bool(torch.allclose(ta, tb, rtol=1e-5, atol=1e-7))


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(
        _same_state(a[k], b[k]) if isinstance(a[k], dict) else _close(a[k], b[k]) for k in a
    )


def check_ddp_pair(tmp: Path, device: str, backend: str | None) -> bool:
    """DDP with two ranks: train, resume, fail (three launches)."""
    extra = ["--device", device] + ([] if backend is None else ["--backend", backend])
    train, resume, fail = tmp / "train", tmp / "resume", tmp / "fail"
    rc, out, _ = _launch("ddp_train.py", train, 2, "--mode", "train", *extra)
    if not _report("train", rc == 0, out[-2000:]):
        return False
    r0, r1 = _ranks(train, 2)
    ok = _report("wrapped in DistributedDataParallel", r0["ddp"] == "DistributedDataParallel")
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
    rc, out, _ = _launch("ddp_train.py", resume, 2, "--mode", "resume", "--load", str(ckpt), *extra)
    resumed = rc == 0 and all(
        _same_state(a["params"], b["params"])
        for a, b in zip(_ranks(resume, 2), (r0, r1), strict=True)
    )
    ok &= _report("two ranks resume from rank zero's checkpoint", resumed, out[-2000:])
    rc, out, elapsed = _launch("ddp_train.py", fail, 2, "--mode", "fail", *extra)
    failed = rc != 0 and "boom on rank 1 at batch 2" in out and elapsed < 60
    closed = failed and [r["rank"] for r in _ranks(fail, 2)] == [0, 1]
    return ok & _report(
        f"an exception on rank 1 stops both ranks (exit {rc}, {elapsed:.1f} s)",
        closed,
        out[-3000:],
    )


def check_ddp_single(tmp: Path, device: str = "cuda:0", backend: str = "nccl") -> bool:
    """One rank (over NCCL) with a model wrapped in DDP by the script: train, then resume."""
    extra = ["--device", device, "--backend", backend, "--wrap"]
    train, resume = tmp / "train", tmp / "resume"
    rc, out, _ = _launch("ddp_train.py", train, 1, "--mode", "train", *extra)
    if not _report("train", rc == 0, out[-2000:]):
        return False
    (r0,) = _ranks(train, 1)
    ok = _report(
        f"DistributedDataParallel on {device}, all 8 samples per epoch",
        r0["ddp"] == "DistributedDataParallel"
        and r0["device"] == device
        and [sorted(s) for s in r0["seen"]] == [list(range(8))] * 2,
        str({k: r0[k] for k in ("ddp", "device", "seen")}),
    )
    ckpt = train / "ckpt" / "ep1-ba8-rank0.pt"
    rc, out, _ = _launch("ddp_train.py", resume, 1, "--mode", "resume", "--load", str(ckpt), *extra)
    resumed = rc == 0 and _same_state(_ranks(resume, 1)[0]["params"], r0["params"])
    return ok & _report("resume from its checkpoint", resumed, out[-2000:])


def check_fsdp(tmp: Path, nproc: int, device: str, backend: str) -> bool:
    """FSDP (fully_shard): DCP folders from every rank; a mid-epoch resume (two launches)."""
    extra = ["--device", device, "--backend", backend]
    train, resume = tmp / "train", tmp / "resume"
    rc, out, _ = _launch("fsdp_train.py", train, nproc, "--mode", "train", *extra)
    if not _report("train", rc == 0, out[-2000:]):
        return False
    full = _ranks(train, nproc)
    per_epoch = 8 // nproc  # 8 samples, batches of one, 2 epochs; saved every 2 batches
    last = 2 * per_epoch
    kept = [f"ep{(b - 1) // per_epoch}-ba{b}" for b in range(last - 4, last + 1, 2)]  # 3 kept
    folders = sorted(p.name for p in (train / "ckpt").iterdir())
    shards = [".metadata"] + [f"__{r}_0.distcp" for r in range(nproc)]
    written = folders == kept and all(
        sorted(p.name for p in (train / "ckpt" / f).iterdir()) == shards for f in folders
    )
    ok = _report(f"{nproc} rank(s) write each DCP folder, 3 kept", written, str(folders))
    ok &= _report("not wrapped in DDP", full[0]["wrapper"] == "FSDPNet", full[0]["wrapper"])
    load = str(train / "ckpt" / kept[1])  # in the second epoch
    rc, out, _ = _launch("fsdp_train.py", resume, nproc, "--mode", "resume", "--load", load, *extra)
    resumed = rc == 0 and all(
        _same_state(a["model"], b["model"]) and _same_state(a["optim"], b["optim"])
        and a["seen"] == b["seen"] and a["batch"] == b["batch"] == last
        for a, b in zip(_ranks(resume, nproc), full, strict=True)
    )  # fmt: skip
    return ok & _report(f"resume from {kept[1]} ends as uninterrupted", resumed, out[-2000:])


class Check(NamedTuple):
    """One check of the plan: a title and how to run it in a scratch folder."""

    title: str
    run: Callable[[Path], bool]


def plan(cpu: bool, gpus: int) -> list[Check]:
    """The checks for this machine (``gpus`` CUDA devices; the CPU with ``cpu``)."""
    if cpu:
        return [
            Check("DDP, 2 ranks on the CPU (gloo)", lambda t: check_ddp_pair(t, "cpu", None)),
            Check("FSDP, 2 ranks on the CPU (gloo)", lambda t: check_fsdp(t, 2, "cpu", "gloo")),
        ]
    both = "cpu:gloo,cuda:nccl"
    if gpus >= 2:
        return [
            Check(f"DDP, 2 ranks on cuda:0 and cuda:1 ({both})",
                  lambda t: check_ddp_pair(t, "cuda", None)),
            Check(f"FSDP, 2 ranks on cuda:0 and cuda:1 ({both})",
                  lambda t: check_fsdp(t, 2, "cuda", both)),
        ]  # fmt: skip
    return [
        Check("DDP, 2 ranks both on cuda:0 over gloo (NCCL needs a GPU per rank)",
              lambda t: check_ddp_pair(t, "cuda:0", "gloo")),
        Check("DDP, 1 rank on cuda:0 over NCCL (a real NCCL group, DDP on the GPU)",
              check_ddp_single),
        Check(f"FSDP, 1 rank on cuda:0 ({both})", lambda t: check_fsdp(t, 1, "cuda:0", both)),
        # Not here: FSDP with 2 ranks both on cuda:0 over gloo. Both ranks died of SIGSEGV in
        # gloo's CUDA collectives (torch 2.11.0+cu130, one H200, 2026-11-30); FSDP on CUDA
        # with 2 ranks needs a GPU per rank (NCCL), the plan above for 2+ GPUs.
    ]  # fmt: skip


def run_ddp_check(cpu: bool) -> int:
    """Run the plan's checks; print PASS/FAIL lines; 0 when all pass (or skipped)."""
    if not cpu and not torch.cuda.is_available():
        print("gpu_check --ddp skipped: CUDA is not available here (use --cpu for gloo)")
        return 0
    gpus = 0 if cpu else torch.cuda.device_count()
    where = "CPU" if cpu else f"{gpus} GPU(s), {torch.cuda.get_device_name(0)}"
    print(f"distributed check: torch {torch.__version__}, {where}", flush=True)
    ok = True
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i, check in enumerate(plan(cpu, gpus)):
            print(f"{check.title}:", flush=True)
            folder = Path(tmp, f"check{i}")
            folder.mkdir()
            try:
                ok &= check.run(folder)
            except Exception as exc:  # a missing file after a failed launch, say
                ok &= _report("check", False, f"{type(exc).__name__}: {exc}")
    print(f"({time.monotonic() - start:.0f} s)")
    print("RESULT:", "OK" if ok else "FAILED (see above)")
    return 0 if ok else 1
