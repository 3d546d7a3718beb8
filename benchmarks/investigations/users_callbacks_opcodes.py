"""Where the Python work of the callbacks users turn on goes: opcodes per batch, by thread
and by module (a count of executed bytecodes, so the machine's load does not move it).

    python benchmarks/investigations/users_callbacks_opcodes.py               # tiny, 20 batches
    python benchmarks/investigations/users_callbacks_opcodes.py --config trainbus-bare

Callgrind counts instructions but cannot see Python 3.11's frames; this counts the
bytecodes each Python function executes (``sys.settrace`` with ``f_trace_opcodes``), per
thread: the training thread, the lane threads, the event loop's thread, the rest (the
TensorBoard writer's thread, anyio's workers). Fits of B and 2B batches, the difference over
B is one batch (a fit's fixed costs cancel). The configs are those of
``users_callbacks_callgrind.py`` (same callbacks, same arms). An opcode is not an
instruction (a call or an attribute lookup costs several hundred of them, a jump a few): it
says where the interpreter runs, and a change's effect on it is read beside callgrind's
totals. Tracing slows every thread alike, but it changes how often threads interleave:
counts that depend on interleaving (wake-ups, a sleeping lane thread's look at its queue)
move by a few percent between runs.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import workload as wl  # noqa: E402
from users_callbacks_callgrind import CONFIGS, _fit  # noqa: E402

Key = tuple[str, str, str]  # (thread group, module, function)


def _group(name: str) -> str:
    if name.startswith("trainbus-train"):
        return "training thread"
    if name.startswith("trainbus-lane"):
        return "lane threads"
    if name == "MainThread":
        return "event loop"
    return "other threads"


def _module(filename: str) -> str:
    for marker in ("/src/", "site-packages/", "/lib/python3"):
        if marker in filename:
            return filename.split(marker, 1)[1].removeprefix(".11/")
    return filename


class OpcodeCounter:
    """Counts executed opcodes per (thread group, module, function) while ``on``."""

    def __init__(self) -> None:
        self.counts: collections.Counter[Key] = collections.Counter()
        self.on = False
        self._groups: dict[int, str] = {}

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode" and self.on:
            ident = threading.get_ident()
            group = self._groups.get(ident)
            if group is None:
                group = self._groups[ident] = _group(threading.current_thread().name)
            code = frame.f_code
            self.counts[(group, _module(code.co_filename), code.co_name)] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def install(self) -> None:
        threading.settrace(self._global)
        sys.settrace(self._global)

    def uninstall(self) -> None:
        threading.settrace(None)  # type: ignore[arg-type]
        sys.settrace(None)


def measure(config: str, workload: str, batches: int) -> dict[Key, float]:
    """Opcodes per batch of ``config``: (fit of 2B batches - fit of B) / B."""
    w = wl.make_workload(workload, 2 * batches)
    counter = OpcodeCounter()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        _fit(config, w, wl.TimedBatches(w.batches[:5]), Path(tmp) / "warm")
        counter.install()
        try:
            for n in (batches, 2 * batches):
                folder = Path(tmp) / f"run{n}"
                folder.mkdir()
                gc.collect()
                counter.counts.clear()
                counter.on = True
                _fit(config, w, wl.TimedBatches(w.batches[:n]), folder)
                counter.on = False
                runs.append(collections.Counter(counter.counts))
        finally:
            counter.uninstall()
    small, large = runs
    return {k: (large[k] - small[k]) / batches for k in set(small) | set(large)}


def report(per_batch: dict[Key, float], top: int) -> None:
    by_group: collections.Counter[str] = collections.Counter()
    by_module: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    for (group, module, _), value in per_batch.items():
        by_group[group] += value
        by_module[group][module] += value
    print(f"opcodes per batch, all threads: {sum(by_group.values()):,.0f}")
    for group, total in by_group.most_common():
        print(f"\n{group}: {total:,.0f}")
        for module, value in by_module[group].most_common(top):
            if abs(value) >= 1:
                print(f"  {value:9,.0f}  {module}")
    print("\nby function, all threads:")
    ranked = sorted(per_batch.items(), key=lambda kv: -kv[1])[:top]
    for (group, module, function), value in ranked:
        print(f"  {value:9,.0f}  {group:15s} {module}:{function}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="trainbus-all", choices=CONFIGS)
    parser.add_argument("--workload", default="tiny", choices=sorted(wl.WORKLOADS))
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    import torch.utils.tensorboard  # noqa: F401  (imported before any count)

    report(measure(args.config, args.workload, args.batches), args.top)


if __name__ == "__main__":
    main()
