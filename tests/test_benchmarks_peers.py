"""The peer benchmark runs in rounds interleaved across frameworks and pairs runs of a round.

SPEC section 7: report ratios from rounds interleaved across frameworks (each round pairs
every framework under the same machine state), with min and median, and say how far the
rounds spread. ``benchmarks/peers/run_all_peers.py`` drives one long-lived worker per
framework (``run_<peer>.py --serve``) round by round in a rotating order;
``benchmarks/peers/pairing.py`` computes the paired figures; ``benchmarks/run_all.py``
takes its targets table from them. Figures are not asserted (timing claims belong to
``benchmarks/``): the arithmetic is checked on fixed numbers, the workers and the
coordinator on the plain and trainbus workers (no peer venvs needed), one short epoch each.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def modules() -> Iterator[dict[str, ModuleType]]:
    """``pairing``, ``run_all_peers`` and ``run_all``, imported from benchmarks/."""
    paths = [str(BENCH), str(BENCH / "peers")]
    sys.path[:0] = paths
    try:
        import pairing
        import run_all
        import run_all_peers

        yield {"pairing": pairing, "run_all_peers": run_all_peers, "run_all": run_all}
    finally:
        for path in paths:
            while path in sys.path:
                sys.path.remove(path)


def rounds_of(ms: list[dict[str, float]]) -> list[dict[str, Any]]:
    return [{"index": i, "workloads": ["mlp"], "wall_s": 10.0, "ms": m, "runs": {}}
            for i, m in enumerate(ms)]


def test_round_order_rotates_so_no_framework_always_runs_first_or_last(
        modules: dict[str, ModuleType]) -> None:
    rap = modules["run_all_peers"]
    peers = ["plain", "trainbus", "ignite"]
    plan = [("a", 3), ("b", 3), ("b-blocking", 3), ("d1", 1), ("d", 1)]
    orders = [rap.round_order(plan, peers, i) for i in range(4)]
    for order in orders:  # every run once per round, its scenario group together
        assert sorted(order) == sorted(
            (p, sc, reps) for sc, reps in plan for p in peers if rap.runs_on(p, sc))
        groups = [sc[0] for _, sc, _ in order]
        assert groups == sorted(groups, key="abd".index)
    a_firsts = {order[0][0] for order in orders[:3]}
    a_lasts = {[p for p, sc, _ in order if sc == "a"][-1] for order in orders[:3]}
    assert a_firsts == a_lasts == set(peers)  # 3 rounds: each takes first and last place once
    # the d group holds plain's d1 beside the d's: its baseline rotates with them
    d_group = [(p, sc) for p, sc, _ in orders[0] if sc.startswith("d")]
    assert ("plain", "d1") in d_group and len(d_group) == 4


def test_paired_figures_pair_runs_of_the_same_round(modules: dict[str, ModuleType]) -> None:
    pairing = modules["pairing"]
    key = pairing.key
    plain, tb = key("plain", "mlp", "a"), key("trainbus", "mlp", "a")
    # round 2 ran on a busy machine: both sides slow; round 3 lost trainbus's run
    rounds = rounds_of([{plain: 1.0, tb: 1.1}, {plain: 2.0, tb: 2.3}, {plain: 1.0},
                        {plain: 1.2, tb: 1.25}])
    d = pairing.diff(rounds, tb, plain)
    assert d.values == pytest.approx((0.1, 0.3, 0.05))
    assert d.n == 3
    assert d.median == pytest.approx(0.1)
    assert d.min == pytest.approx(0.05)
    assert d.spread == pytest.approx(0.25)
    assert d.cell() == "+0.100 ms (min +0.050, spread 0.250, 3 rounds)"
    # unpaired medians would say +0.175 ms (medians 1.25 and 1.1 over all runs)
    q = pairing.ratio(rounds, tb, plain)
    assert q.median == pytest.approx(1.1)
    per = pairing.per_call(rounds, tb, plain, 10)
    assert per.values == pytest.approx((10.0, 30.0, 5.0))
    assert pairing.per_call(rounds, tb, plain, 0) is None
    assert pairing.diff(rounds, key("ignite", "mlp", "a"), plain) is None
    assert pairing.base_scenario("d-lag1") == "d1"
    assert pairing.base_scenario("b-async") == "b"


def peers_json(pairing: ModuleType) -> dict[str, Any]:
    """Three rounds of fixed numbers for every figure of the targets table."""
    calls = {"b": 120, "b-async": 120, "b-blocking": 120, "c": 1200}
    base = {("plain", "a"): 1.0, ("plain", "b"): 1.0, ("plain", "d1"): 7.0,
            ("trainbus", "a"): 1.1, ("trainbus", "b"): 1.4, ("trainbus", "b-async"): 1.5,
            ("trainbus", "b-blocking"): 1.2, ("trainbus", "c"): 4.0, ("trainbus", "d"): 7.2,
            ("ignite", "a"): 1.05, ("ignite", "b"): 1.11}
    slow = (1.0, 1.5, 1.1)  # the machine state of each round, shared by its runs
    rounds = rounds_of([{pairing.key(fw, "mlp", sc): ms * f for (fw, sc), ms in base.items()}
                        for f in slow])
    results = [{"framework": fw, "version": "1", "workload": "mlp", "scenario": sc,
                "ms_per_batch": [ms * f for f in slow], "setup_ms": [1.0],
                "handler_calls_per_batch": (40 if fw == "ignite" and sc == "b" else
                                            calls.get(sc, 0) if fw != "plain" else 0),
                "torch": "2"} for (fw, sc), ms in base.items()]
    return {"machine": {"quick": False, "loadavg_before": [0.5], "loadavg_after": [0.6]},
            "rounds": rounds, "results": results, "stopped_by_budget": False}


def test_the_targets_table_takes_trainbus_figures_from_the_paired_rounds(
        modules: dict[str, ModuleType], tmp_path: Path) -> None:
    run_all, pairing = modules["run_all"], modules["pairing"]
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nold\n\n## Targets (SPEC section 7)\n\n| old |\n\n"
                      "### A note by hand\n\nkept.\n\n## By hand\n\nalso kept.\n\n"
                      "## Timeline of scenario (d)\n\nold\n")
    lateness = {"idle": {"p50_ms": 0.1, "p99_ms": 0.5, "max_ms": 1.0},
                "training": {"p50_ms": 0.2, "p99_ms": 1.5, "max_ms": 2.0}}
    trailing = {"summary": {"trailing(2)": {"diff_median": 0.3}}, "verdict": "met",
                "conditions": "c", "table": "t", "cpu_table": "u"}
    bus = "calls/s with 10 callbacks: 400,000\nplain code,  10 no-op callbacks: 12.5 us\n"
    windows = {"summary": {"upload wall settle=5": {"median": 0.21, "interval": [0.1, 0.4],
                                                     "n": 24}},
               "target": "upload wall settle=5", "verdict": "shown", "text": "WINDOWS TABLE"}
    run_all.write_readme(peers_json(pairing), lateness, bus, "python benchmarks/run_all.py",
                         trailing, readme, windows=windows)
    text = readme.read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
            if line.startswith("| ")}
    # per round (x1.0, x1.5, x1.1): trainbus(a) - plain(a) = 0.1, 0.15, 0.11: median 0.11
    assert "+0.110 ms (min +0.100, spread 0.050, 3 rounds): met" in rows[
        "overhead per batch, no callbacks"]
    # trainbus(b) - trainbus(a) = 0.3, 0.45, 0.33
    assert "+0.330 ms (min +0.300, spread 0.150, 3 rounds): **missed**" in rows[
        "10 no-op callbacks, more than (a)"]
    assert "+0.220 ms" in rows["4 x 5 ms callbacks vs plain loop sleeping 5 ms (d1)"]
    # @blocking: (1.2 - 1.1) / 120 = 0.83 us x the round's factor, Ignite (1.11 - 1.05) / 40
    blocking = rows["`@blocking` no-op handler call (b-blocking)"]
    assert "0.92 us vs Ignite 1.65 us" in blocking and blocking.endswith(": met |")
    assert "median over rounds of trainbus(a) - plain(a) of the same round" in " ".join(
        text.split())
    assert "3 rounds, 0 of them with the large model" in " ".join(text.split())
    # (g): the paired windows decide; the fresh runs' figure stands beside them
    assert ("+0.21 ms in paired windows (95% CI +0.10 .. +0.40, 24 blocks): shown; +0.30 ms "
            "in fresh runs paired by round (met)") in rows[
        "5 ms upload per batch, `@trailing(2)`, over no upload (g)"]
    assert "## (g) in paired windows" in text and "WINDOWS TABLE" in text
    assert "### A note by hand\n\nkept." in text and "## By hand\n\nalso kept." in text
    mlp = text.split("## MLP")[1]
    assert "| a | trainbus 1 | 1.210 (1.100-1.650) | +0.110 ms (min +0.100" in mlp
    assert "| trainbus | b-blocking | 120 | 0.92 us (min 0.83, spread 0.42, 3 rounds) |" in mlp


def test_a_worker_answers_each_command_and_survives_a_bad_one(
        modules: dict[str, ModuleType], tmp_path: Path) -> None:
    rap = modules["run_all_peers"]
    worker = rap.Worker("plain", tmp_path)
    try:
        hello = worker.ready()
        assert hello["framework"] == "plain" and hello["pid"] == worker.proc.pid
        with pytest.raises(RuntimeError, match="KeyError: 'zz'"):
            worker.run("mlp", "zz", 1, "")
        first = worker.run("mlp", "a", 2, "")
        again = worker.run("mlp", "a", 1, "")
        other = worker.run("mlp", "b", 1, "")
    finally:
        worker.close()
    assert worker.proc.returncode == 0
    assert len(first["ms_per_batch"]) == 2 and len(again["ms_per_batch"]) == 1
    # a full warm-up epoch for the worker's first run of the workload, 20 batches for a new
    # scenario, none for a scenario it ran before
    assert [first["warmup_batches"], other["warmup_batches"], again["warmup_batches"]] == [
        200, 20, 0]
    assert other["handler_calls_per_batch"] == 120


def test_the_coordinator_interleaves_plain_and_trainbus_workers(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "peers" / "run_all_peers.py"), "--peers", "plain,trainbus",
         "--workloads", "mlp", "--scenarios", "a", "--rounds", "2", "--reps", "1",
         "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    peers = json.loads(out.read_text())
    orders = [r["order"] for r in peers["rounds"]]
    assert orders == [["plain/mlp/a", "trainbus/mlp/a"], ["trainbus/mlp/a", "plain/mlp/a"]]
    assert peers["failures"] == []
    by = {r["framework"]: r for r in peers["results"]}
    assert len(by["trainbus"]["ms_per_batch"]) == 2
    assert by["trainbus"]["round_ms"] == [
        r["ms"]["trainbus/mlp/a"] for r in peers["rounds"]]
    assert statistics.median(by["plain"]["round_ms"]) > 0
    assert "vs plain a" in peers["table"] and "2 rounds" in peers["table"]
