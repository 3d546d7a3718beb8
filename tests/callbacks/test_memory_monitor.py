"""MemoryMonitor: process RSS on the CPU (psutil or /proc), allocator stats on CUDA."""

from __future__ import annotations

import sys

import psutil
import pytest
import torch

from tests.helpers import make_trainer
from trainbus.callbacks import MemoryMonitor
from trainbus.core.callback import resolve_callback
from trainbus.loggers import InMemoryLogger


def rss_gb() -> float:
    return psutil.Process().memory_info().rss / 1e9


def test_logs_rss_and_peak_at_each_due_batch() -> None:
    logs = InMemoryLogger()
    make_trainer(4, 2, [MemoryMonitor(interval="3ba")], loggers=[logs]).fit_sync()
    rss = logs.get_timeseries("memory/rss_gb")
    assert rss["step"] == [3, 6]
    now = rss_gb()
    for value in rss["memory/rss_gb"]:
        assert 0.5 * now < value < 2 * now  # the same process, a moment earlier
    peak = logs.get_timeseries("memory/peak_rss_gb")["memory/peak_rss_gb"]
    assert all(p >= r * 0.99 for p, r in zip(peak, rss["memory/rss_gb"], strict=True))


def test_epoch_interval_logs_at_epoch_ends() -> None:
    logs = InMemoryLogger()
    make_trainer(3, 2, [MemoryMonitor(interval="1ep")], loggers=[logs]).fit_sync()
    assert logs.get_timeseries("memory/rss_gb")["step"] == [3, 6]


def test_default_interval_is_ten_batches() -> None:
    logs = InMemoryLogger()
    make_trainer(10, 2, [MemoryMonitor()], loggers=[logs]).fit_sync()
    assert logs.get_timeseries("memory/rss_gb")["step"] == [10, 20]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_without_psutil_reads_proc_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` now raises ImportError
    logs = InMemoryLogger()
    make_trainer(2, 1, [MemoryMonitor(interval="1ba")], loggers=[logs]).fit_sync()
    monkeypatch.undo()
    values = logs.get_timeseries("memory/rss_gb")["memory/rss_gb"]
    assert len(values) == 2
    assert values[-1] == pytest.approx(rss_gb(), rel=0.2)


def test_handlers_are_blocking_so_no_thread_is_woken_per_batch() -> None:
    table = resolve_callback(MemoryMonitor())
    assert {e.value for e in table.handlers} == {"fit_start", "batch_end", "epoch_end"}
    assert all(h.is_blocking and not h.is_async for h in table.handlers.values())
    assert not table.has_sync


def test_bad_interval_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"MemoryMonitor\(interval=\.\.\.\)=.*must be positive"):
        MemoryMonitor(interval="0ba")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_allocator_stats_without_syncs() -> None:  # pragma: no cover - GPU machines
    logs = InMemoryLogger()
    monitor = MemoryMonitor(interval="2ba")
    make_trainer(4, 1, [monitor], loggers=[logs], device="cuda").fit_sync()
    assert logs.get_timeseries("memory/allocated_gb")["step"] == [2, 4]
    assert logs.most_recent_values["memory/reserved_gb"] > 0
    assert logs.most_recent_values["memory/alloc_retries"] >= 0
    assert "memory/rss_gb" not in logs.data
    state = make_trainer(1, 1, device="cuda").state
    torch.cuda.set_sync_debug_mode("error")
    try:
        read = monitor.read(state)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    peak = torch.cuda.memory_stats()["allocated_bytes.all.peak"] / 1e9
    assert 0 < read["memory/peak_allocated_gb"] <= peak
