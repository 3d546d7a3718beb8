"""The suite's runner: worker processes per framework, interleaved rounds, callgrind counts
quiet and beside a CPU-bound neighbour, trainbus-only measurements in fresh processes.

Every measurement runs in a child process (as pyperf and asv do): a peer in its own
virtual environment (``benchmarks/.venvs/<name>``, made by ``setup_peers.sh``), trainbus and
the plain loop on this interpreter with ``src/`` first on the path, so the working tree is
what is measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.stats import Count

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
PEERS = {"ignite_fw": "ignite", "lightning_fw": "lightning", "composer_fw": "composer"}
#: counted beside the neighbour too: trainbus, and the plain loop as the method's control
LOADED_PASS = ("plain", "trainbus_fw")
#: peers whose callgrind process takes minutes: counted in the full run only
QUICK_UNCOUNTED = ("lightning_fw", "composer_fw")
LABELS = {"plain": "plain loop", "trainbus_fw": "trainbus", "ignite_fw": "Ignite",
          "lightning_fw": "Lightning", "composer_fw": "Composer"}


#: callgrind processes running now (``kill_children`` ends them when the run is stopped)
CHILDREN: set[subprocess.Popen[str]] = set()


def kill_children() -> None:
    for proc in list(CHILDREN):
        proc.kill()


def real_python(python: str) -> str:
    """The interpreter itself, not a pyenv shim (valgrind would measure the shim)."""
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def python_for(adapter: str) -> Path:
    if adapter in PEERS:
        return VENVS / PEERS[adapter] / "bin" / "python"
    return Path(real_python(sys.executable))


#: The trainbus source measured: this tree's, or another checkout's (``--trainbus-src``, for a
#: before/after comparison of a change; the run's report names it).
TRAINBUS_SRC = Path(os.environ.get("TRAINBUS_BENCH_SRC", ROOT / "src"))


def env_for(adapter: str) -> dict[str, str]:
    path = [str(BENCH)] if adapter in PEERS else [str(TRAINBUS_SRC), str(BENCH)]
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
            "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1",
            "PYTHONHASHSEED": "0"}


class Worker:
    """A long-lived ``harness.worker serve`` process for one framework."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        self.proc = subprocess.Popen(
            [str(python_for(adapter)), "-m", "harness.worker", "serve", adapter],
            cwd=BENCH, env=env_for(adapter), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        hello = self._read()
        self.version: str = hello["version"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.adapter} worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        if not out["ok"]:
            raise RuntimeError(f"{self.adapter} {cmd}: {out['error']}")
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write('{"cmd": "quit"}\n')
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@contextlib.contextmanager
def neighbour() -> Iterator[None]:
    """A CPU-bound process (a busy Python loop) running beside the measurement."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def latency_server(latency_ms: float) -> Iterator[str]:
    """``latency_server.py`` in its own process; yields its URL."""
    cmd = [sys.executable, str(BENCH / "latency_server.py"), "--port", "0",
           "--latency-ms", str(latency_ms)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            yield proc.stdout.readline().strip()
        finally:
            proc.terminate()


def _totals(path: Path) -> tuple[int, bool]:
    text = path.read_text(errors="replace")
    match = re.search(r"^totals: (\d+)", text, re.M)
    return (int(match.group(1)) if match else 0), "addmm" in text


def callgrind(adapter: str, configs: Sequence[dict[str, Any]], loaded: bool,
              timeout: float = 1500, threads: bool = True) -> list[dict[str, float]]:
    """Per config: instructions per batch (or per ``run_event`` call) on the training thread
    (the thread that ran the model's ``addmm``; the calling thread for ``run_event``) and on
    all threads, from the difference between its two dumps. ``threads=False``: all threads
    only, in one file per dump (a dump of 1,000 threads' files takes minutes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--separate-threads={'yes' if threads else 'no'}",
               "--max-threads=4000",  # a thread per plain callback: 1,000 in the growth row
               f"--callgrind-out-file={out}", str(python_for(adapter)), "-m",
               "harness.worker", "callgrind", adapter, "--configs", json.dumps(list(configs))]
        with neighbour() if loaded else contextlib.nullcontext():
            proc = subprocess.Popen(cmd, cwd=BENCH, env=env_for(adapter), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            CHILDREN.add(proc)
            try:
                _, stderr = proc.communicate(timeout=timeout)
            finally:
                proc.kill()
                CHILDREN.discard(proc)
        if proc.returncode:
            raise RuntimeError(f"callgrind {adapter} failed:\n{stderr[-3000:]}")
        dumps: dict[int, list[tuple[int, bool]]] = {}
        for path in Path(tmp).glob("cg.out.*"):
            number = int(path.name.split(".")[-1].split("-")[0])
            dumps.setdefault(number, []).append(_totals(path))

    def figures(number: int) -> tuple[int, int]:
        threads = dumps.get(number, [])
        trained = [total for total, addmm in threads if addmm]
        main = sorted(threads, key=lambda t: -t[0])[:1]
        train = max(trained) if trained else (main[0][0] if main else 0)
        return train, sum(total for total, _ in threads)

    results = []
    for i, config in enumerate(configs):
        t1, a1 = figures(2 * i + 1)
        t2, a2 = figures(2 * i + 2)
        units = config["run_event"] if config.get("run_event") else (
            config["batches"][1] - config["batches"][0])
        results.append({"train": (t2 - t1) / units, "all": (a2 - a1) / units})
    return results


@dataclass
class Context:
    """What a benchmark's ``run(ctx)`` gets: the mode, the peers, workers, counts."""

    quick: bool
    log: Any = print
    workers: dict[str, Worker] = field(default_factory=dict)
    counts: dict[tuple[str, str, bool], dict[str, float]] = field(default_factory=dict)
    availability: dict[str, str | None] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    #: frameworks whose instructions are not counted in this run, and why
    uncounted: dict[str, str] = field(default_factory=dict)
    #: (framework, config) -> why its callgrind process failed
    count_errors: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return 3 if self.quick else 5

    def missing(self, adapter: str) -> str | None:
        """Why ``adapter`` cannot run here (None: it can)."""
        if adapter not in self.availability:
            py = python_for(adapter)
            reason: str | None = None
            if not py.exists():
                reason = f"not installed here: no {py.relative_to(BENCH)} (bash benchmarks/setup_peers.sh)"
            else:
                proc = subprocess.run(
                    [str(py), "-c", f"import harness.frameworks.{adapter} as m; print(m.VERSION)"],
                    cwd=BENCH, env=env_for(adapter), capture_output=True, text=True)
                if proc.returncode:
                    reason = "cannot import: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
                else:
                    self.versions[adapter] = proc.stdout.strip().splitlines()[-1]
            self.availability[adapter] = reason
        return self.availability[adapter]

    def peers(self) -> list[str]:
        return [a for a in PEERS if self.missing(a) is None]

    def worker(self, adapter: str) -> Worker:
        if adapter not in self.workers:
            self.workers[adapter] = Worker(adapter)
            self.versions[adapter] = self.workers[adapter].version
        return self.workers[adapter]

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()

    def interleaved(self, arms: Sequence[tuple[str, str, int]], *, workload: str,
                    batches: int, reps: int, url: str | None = None,
                    rounds: int | None = None) -> dict[tuple[str, str, int], list[float]]:
        """ms per batch (median of ``reps`` epochs) of each arm, round by round, the order
        of the arms rotated each round."""
        rounds = rounds or self.rounds
        out: dict[tuple[str, str, int], list[float]] = {arm: [] for arm in arms}
        for r in range(rounds):
            shift = r % len(arms)
            for arm in [*arms[shift:], *arms[:shift]]:
                adapter, scenario, n = arm
                res = self.worker(adapter).run(workload=workload, scenario=scenario, n=n,
                                               batches=batches, reps=reps, url=url)
                out[arm].append(res["median"])
        return out

    def _pair(self, adapter: str, config: dict[str, Any]) -> tuple[dict[str, float],
                                                                    dict[str, float] | None]:
        key = json.dumps(config, sort_keys=True)
        if (adapter, key, False) not in self.counts:
            why = self.count_errors.get((adapter, key)) or self.count_reason(adapter)
            raise RuntimeError(f"no instruction count for {LABELS[adapter]} {key}: {why}")
        return self.counts[(adapter, key, False)], self.counts.get((adapter, key, True))

    def count(self, adapter: str, config: dict[str, Any]) -> Count:
        """A config's count on the training thread, quiet and loaded (``prefetch_counts``)."""
        quiet, loaded = self._pair(adapter, config)
        return Count(quiet["train"], loaded["train"] if loaded else None)

    def count_all(self, adapter: str, config: dict[str, Any]) -> Count:
        """A config's count on all threads, quiet and loaded."""
        quiet, loaded = self._pair(adapter, config)
        return Count(quiet["all"], loaded["all"] if loaded else None)

    def prefetch_counts(self, plan: dict[str, list[dict[str, Any]]]) -> None:
        """One callgrind process per framework and condition for every config the selected
        benchmarks declared (the 1,000-callback configs in a second one): all quiet, one at a
        time, then trainbus's and the plain loop's beside a CPU-bound neighbour (but the
        1,000-callback configs). With
        ``quick`` the quiet processes run two at a time (a framework's configs, when more
        than 4, split over two of them), the longest first, and the loaded pass is left
        out."""
        if self.quick:
            for adapter in QUICK_UNCOUNTED:
                self.uncounted[adapter] = "not counted in --quick (minutes under callgrind)"
        for loaded in (False,) if self.quick else (False, True):
            jobs = []
            for adapter, configs in plan.items():
                unique = list({json.dumps(c, sort_keys=True): c for c in configs}.values())
                if self.count_reason(adapter) is not None or (
                        loaded and adapter not in LOADED_PASS):
                    continue
                # the 1,000-callback fits in a process of their own, all threads counted
                # together (two processes can run at once)
                small = [c for c in unique if c.get("n", 0) < 1000]
                # --quick: a framework's many configs in two processes, so that the two
                # slots share the longest one's work (counts do not depend on the process)
                halves = ([small[::2], small[1::2]] if self.quick and len(small) > 4
                          else [small])
                for part in (*halves, [c for c in unique if c.get("n", 0) >= 1000]):
                    # 1,000 threads take minutes under valgrind: counted quiet only
                    if part and not (loaded and part[0].get("n", 0) >= 1000):
                        jobs.append((adapter, part))
            jobs.sort(key=lambda job: -len(job[1]))  # the longest first: a shorter makespan
            with ThreadPoolExecutor(max_workers=2 if self.quick else 1) as pool:
                futures = [(adapter, todo, pool.submit(self._timed_callgrind, adapter, todo,
                                                       loaded)) for adapter, todo in jobs]
                for adapter, todo, future in futures:
                    try:
                        figures = future.result()
                    except Exception as exc:  # the rows that need it say so
                        reason = str(exc).strip().splitlines()[0]
                        for config in todo:
                            self.count_errors[(adapter, json.dumps(config, sort_keys=True))] = (
                                f"{reason} ({'loaded' if loaded else 'quiet'})")
                        self.log(f"  callgrind {LABELS[adapter]}: {exc}"[:3000])
                        continue
                    for config, fig in zip(todo, figures, strict=True):
                        self.counts[(adapter, json.dumps(config, sort_keys=True), loaded)] = fig

    def count_reason(self, adapter: str) -> str | None:
        """Why ``adapter`` has no instruction counts in this run (None: it has)."""
        if adapter == "plain":
            return None
        return self.missing(adapter) or self.uncounted.get(adapter)

    def _timed_callgrind(self, adapter: str, todo: list[dict[str, Any]],
                         loaded: bool) -> list[dict[str, float]]:
        t0 = time.perf_counter()
        figures = callgrind(adapter, todo, loaded,
                            threads=all(c.get("n", 0) < 1000 for c in todo))
        self.log(f"  callgrind {LABELS[adapter]} ({'loaded' if loaded else 'quiet'}, "
                 f"{len(todo)} configs): {time.perf_counter() - t0:.0f} s")
        return figures

    def child(self, module: str, **kwargs: Any) -> Any:
        """``suite.<module>.measure(**kwargs)`` in a fresh trainbus process; its JSON result."""
        code = (f"import json, sys; from suite import {module} as m; "
                f"print('\\n' + json.dumps(m.measure(**json.loads(sys.argv[1]))))")
        proc = subprocess.run([str(python_for("trainbus_fw")), "-c", code, json.dumps(kwargs)],
                              cwd=BENCH, env=env_for("trainbus_fw"), capture_output=True,
                              text=True, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{module} failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
