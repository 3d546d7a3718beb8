"""The slow rank named: each rank's step time and data wait gathered beside training, rank
zero's figures and its one warning (``runtime/rank_times.py``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainbus.runtime.rank_times import RankFigures, RankTimesConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "distributed_scripts" / "slow_rank.py"


@pytest.mark.slow
def test_rank_zero_names_the_rank_whose_loader_is_slower(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1",
               TRAINBUS_RANK_TIMES_EVERY="8")  # fmt: skip
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(SCRIPT), str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logged = json.loads((tmp_path / "rank0.json").read_text())
    # 40 batches a rank, a gathering every 8: 5 reports (the last one at the fit's end).
    assert len(logged["ranks/slowest"]) == 5
    assert logged["ranks/slowest"] == [1.0] * 5
    assert min(logged["ranks/slowest_ratio"]) >= 1.25
    slow, fast = logged["ranks/data_seconds/rank1"], logged["ranks/data_seconds/rank0"]
    assert all(s >= 0.025 > f for s, f in zip(slow, fast, strict=True))
    # One warning, naming the rank and its host.
    warned = [line for line in proc.stderr.splitlines() if "SlowRankWarning" in line]
    assert len(warned) == 1, proc.stderr
    assert f"rank 1 on host {socket.gethostname()} holds the others back" in warned[0]


def test_figures_name_the_rank_that_made_the_others_wait() -> None:
    # Three ranks in step (the all-reduce ends every step together at 40 ms); rank 2 waited
    # 30 ms for its data, the others 2 ms: rank 2's own time 40 ms, theirs 12 ms.
    rows = [[0.040, 0.002, 8], [0.040, 0.002, 8], [0.040, 0.030, 8]]
    figures = RankFigures.of(16, rows, ("a", "b", "c"))
    assert figures.slowest == 2
    assert figures.own == pytest.approx((0.012, 0.012, 0.040))
    assert figures.ratio == pytest.approx(0.040 / 0.012)
    assert figures.metrics()["ranks/data_seconds/rank2"] == 0.030
    assert "rank 2 on host c" in figures.describe(2)


@pytest.mark.parametrize(("var", "value"), [("TRAINBUS_RANK_TIMES_EVERY", "-1"),
                                            ("TRAINBUS_RANK_TIMES_EVERY", "often"),
                                            ("TRAINBUS_SLOW_RANK_RATIO", "0.5")])  # fmt: skip
def test_a_bad_setting_names_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"{var}={value!r}"):
        RankTimesConfig.from_env({var: value})


def test_zero_turns_the_gathering_off() -> None:
    assert RankTimesConfig.from_env({"TRAINBUS_RANK_TIMES_EVERY": "0"}) is None
    assert RankTimesConfig.from_env({}) == RankTimesConfig()
