"""The checkpoint row's measuring process: one arm (a way of saving) on one model size.

``measure(arm, mb, saves, folder)`` trains an MLP whose parameters and Adam's two moments
together hold ``mb`` MiB (a third each) on one CPU thread and saves ``saves`` checkpoints:

- ``trainbus``: ``Trainer`` + ``CheckpointSaver`` (its ``@blocking`` capture, its writer);
- ``inline``: ``torch.save`` in the loop (to a temporary name, ``fsync``, rename: what the
  saver's writer does, on the training thread);
- ``lightning``: Lightning's ``AsyncCheckpointIO(TorchCheckpointIO())`` called by hand with
  the dict Lightning saves (``state_dict``, ``optimizer_states``);
- ``dcp``: ``torch.distributed.checkpoint.async_save`` called by hand (``get_state_dict``,
  ``FileSystemWriter``), one process (``no_dist=True``).

The schedule is the same for every arm and does not depend on measured time: 3 batches,
then a save at a batch's end; training goes on; once the checkpoint is complete on disk, 3
more batches (no write in flight), then the next save. Per save, on the training thread:
``stall`` (the save's trigger until the next batch starts, minus the same gap of a batch
without a save) and ``extra`` (the batches that ran while the write was in flight: their
time over the median of the batches without a write), ``complete`` (the trigger until the
file, or the DCP folder's ``.metadata``, is on disk), ``peak`` (the process's peak RSS
during the save's window over its peak in the window of 3 batches before it: ``VmHWM``,
reset through ``/proc/self/clear_refs``), and RSS when it completed.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

WIDTH = {10: 256, 100: 1024, 1024: 2048}
BATCH = 8
CALM = 3  # batches without a write in flight before each save


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def hwm_mib() -> float:
    with open("/proc/self/status") as f:
        found = re.search(r"VmHWM:\s+(\d+)", f.read())
    return int(found.group(1)) / 1024 if found else 0.0


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def model_for(mb: int) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """An MLP of square layers whose parameters are ``mb / 3`` MiB, with Adam (stepped once)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = WIDTH.get(mb, 1024)
    layers = max(1, round(mb * 2**20 / 3 / 4 / (width * width + width)))
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = (torch.randn(BATCH, width), torch.randn(BATCH, width))
    step(model, opt, batch)  # Adam's moments exist from here on
    return model, opt, batch


def state_mib(model: nn.Module) -> float:
    """Parameters plus Adam's two moments, MiB: what each checkpoint holds (near enough)."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def step(model: nn.Module, opt: torch.optim.Optimizer, batch: Any) -> None:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(batch[0]), batch[1])
    loss.backward()
    opt.step()


class Recorder:
    """Times and memory of one run: batch starts, ends, save triggers, completions."""

    def __init__(self, saves: int) -> None:
        self.saves = saves
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.triggers: list[tuple[int, float]] = []  # (batch index, time)
        self.done: list[float | None] = []
        self.hwm_calm: list[float] = []
        self.hwm_save: list[float] = []
        self.rss_done: list[float] = []
        self.rss_start = 0.0
        self.calm_left = CALM
        self.finished = False
        self.state_mib = 0.0
        self.saver: dict[str, Any] = {}

    # the schedule ---------------------------------------------------------------------------
    def batch_start(self) -> None:
        if not self.starts:
            self.rss_start = rss_mib()
            reset_hwm()
        self.starts.append(time.perf_counter())

    def batch_end(self) -> bool:
        """Record the batch's end; whether a save is due now (the caller saves at once)."""
        self.ends.append(time.perf_counter())
        if self.triggers and self.done[-1] is None:
            return False  # a write is in flight
        if self.triggers and len(self.hwm_save) < len(self.triggers):
            self.hwm_save.append(hwm_mib())  # the save's window ends with this batch
            self.rss_done.append(rss_mib())
            reset_hwm()
        if self.calm_left:
            self.calm_left -= 1
            return False
        if len(self.triggers) == self.saves:
            self.finished = True
            return False
        self.hwm_calm.append(hwm_mib())
        reset_hwm()
        self.calm_left = CALM
        self.triggers.append((len(self.ends) - 1, time.perf_counter()))
        self.done.append(None)
        return True

    def completed(self) -> None:
        """The checkpoint being written is complete on disk (any thread)."""
        self.done[-1] = time.perf_counter()

    # the figures ----------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        n = len(self.ends)
        compute = [self.ends[i] - self.starts[i] for i in range(n)]
        gaps = [self.starts[i + 1] - self.ends[i] for i in range(n - 1)]
        in_flight = set()
        for (b, _), done in zip(self.triggers, self.done, strict=True):
            assert done is not None
            i = b + 1
            while i < len(self.starts) and self.starts[i] < done:
                in_flight.add(i)
                i += 1
        save_batches = {b for b, _ in self.triggers}
        calm = sorted(compute[i] for i in range(n) if i not in in_flight)
        calm_gaps = sorted(gaps[i] for i in range(n - 1) if i not in save_batches)
        base, base_gap = calm[len(calm) // 2], calm_gaps[len(calm_gaps) // 2]
        out: dict[str, Any] = {"batch_ms": base * 1e3, "saves": []}
        for k, ((b, t), done) in enumerate(zip(self.triggers, self.done, strict=True)):
            assert done is not None
            nxt = self.triggers[k + 1][0] if k + 1 < len(self.triggers) else n
            over = [i for i in range(b + 1, nxt) if i in in_flight]
            out["saves"].append({
                "stall_ms": (self.starts[b + 1] - t - base_gap) * 1e3,
                "extra_ms": sum(compute[i] - base for i in over) * 1e3,
                "overlapped_batches": len(over),
                "complete_ms": (done - t) * 1e3,
                "peak_mib": self.hwm_save[k] - self.hwm_calm[k],
                "rss_mib": self.rss_done[k],
            })  # fmt: skip
        out["rss_start_mib"] = self.rss_start
        out["peak_over_training_mib"] = max(self.hwm_save) - self.hwm_calm[0]
        return out


# -- the arms ------------------------------------------------------------------------------


def _hand_loop(mb: int, rec: Recorder, save: Callable[[nn.Module, Any, int], None]) -> None:
    model, opt, batch = model_for(mb)
    rec.state_mib = state_mib(model)
    k = 0
    while not rec.finished:
        rec.batch_start()
        step(model, opt, batch)
        if rec.batch_end():
            save(model, opt, k)
            k += 1


def _keep_last(folder: Path, k: int) -> None:
    """Delete checkpoint ``k - 1`` once ``k`` is complete (one on disk, as keep=1)."""
    old = folder / f"ckpt{k - 1}"
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)


def run_inline(mb: int, rec: Recorder, folder: Path) -> None:
    def save(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
        path, tmp = folder / f"ckpt{k}", folder / f".ckpt{k}.tmp"
        with open(tmp, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        rec.completed()
        _keep_last(folder, k)

    _hand_loop(mb, rec, save)


def run_lightning(mb: int, rec: Recorder, folder: Path) -> None:
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    io = AsyncCheckpointIO(TorchCheckpointIO())

    def save(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
        checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [opt.state_dict()]}
        io.save_checkpoint(checkpoint, folder / f"ckpt{k}")
        executor = io._executor  # its one writer thread: this runs once the save is written
        assert executor is not None
        executor.submit(lambda: (rec.completed(), _keep_last(folder, k)))

    try:
        _hand_loop(mb, rec, save)
    finally:
        io.teardown()


def run_dcp(mb: int, rec: Recorder, folder: Path) -> None:
    import warnings

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import async_save

    warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)

    def save(model: nn.Module, opt: torch.optim.Optimizer, k: int) -> None:
        model_sd, optim_sd = get_state_dict(model, opt)
        response = async_save({"model": model_sd, "optim": optim_sd},
                              storage_writer=FileSystemWriter(str(folder / f"ckpt{k}")),
                              no_dist=True)
        future = getattr(response, "upload_completion", response)

        def done(_: Any) -> None:
            rec.completed()
            _keep_last(folder, k)

        future.add_done_callback(done)

    _hand_loop(mb, rec, save)


def run_trainbus(mb: int, rec: Recorder, folder: Path) -> None:
    import trainbus
    from trainbus.callbacks import CheckpointSaver

    model, opt, batch = model_for(mb)
    rec.state_mib = state_mib(model)

    class Clock(trainbus.Callback):
        due = False

        @trainbus.blocking
        def after_dataloader(self, state: Any, logger: Any) -> None:
            rec.batch_start()

        @trainbus.blocking
        def batch_checkpoint(self, state: Any, logger: Any) -> None:
            self.due = rec.batch_end()
            if rec.finished:
                state.stop_training()

    clock = Clock()
    saver = CheckpointSaver(folder, filename="ckpt{batch}", num_checkpoints_to_keep=1,
                            save_interval=lambda state, event: clock.due)
    saver.add_listener(lambda timestamp, path: rec.completed())

    class Forever:
        def __len__(self) -> int:
            return 10**6

        def __iter__(self) -> Any:
            while True:
                yield batch

    trainer = trainbus.Trainer(
        model, Forever(), "1000000ba", optimizers=opt, device="cpu",
        loss_fn=nn.functional.mse_loss, callbacks=[clock, saver],
        **{k: False for k in ("log_train_loss", "warn_slow_callbacks")
           if k in __import__("inspect").signature(trainbus.Trainer).parameters},
    )  # fmt: skip
    trainer.fit_sync()
    stats = saver.statistics()
    rec.saver = {"capture_ms_max": stats.capture_seconds_max * 1e3,
                 "wait_ms": stats.wait_seconds * 1e3, "written": stats.written}


ARMS = {"trainbus": run_trainbus, "inline": run_inline, "lightning": run_lightning,
        "dcp": run_dcp}


def measure(arm: str, mb: int, saves: int, folder: str) -> dict[str, Any]:
    where = Path(folder)
    where.mkdir(parents=True, exist_ok=True)
    rec = Recorder(saves)
    try:
        ARMS[arm](mb, rec, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    out = rec.figures()
    out["state_mib"] = rec.state_mib
    out["threads_after"] = threading.active_count()
    out.update(rec.saver)
    return out
