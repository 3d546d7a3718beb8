"""W&B with its default settings, killed at random moments and resumed: one run, each step once.

W&B writes its offline transaction log (``run-<id>.wandb``) every 15 s by default
(``x_transaction_log_flush_interval``); a run killed before that left a 7-byte file, and
before issue 53 the rows up to the checkpoint were missing from the W&B run (the resumed
run replays only what follows the checkpoint). Each checkpoint now saves the rows W&B has
not written yet, and the resumed run logs those the W&B run does not hold.

``tests/crash_child.py --wandb`` (3 epochs x 20 batches of ~50 ms, a checkpoint every 5
batches, an offline ``WandBLogger`` with W&B's defaults and a ``JSONLinesLogger``) is
killed with SIGKILL at random moments after its first checkpoint (the first kill a few
seconds after the process started: well within W&B's first 15 s), resumed from the saver's
folder each time, until it finishes. Read back with W&B's own reader (``wandb leet
inspect``), the offline folders hold one run id and every ``(name, step)`` of the
JSON-lines file (itself exactly once) once, with the same values.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.loggers.test_http_uploader import MetricsServer
from tests.loggers.wandb_files import offline_env, run_folders, wandb_points
from tests.test_crash_consistency import TOTAL, _child
from trainbus.loggers.wandb_logger import last_history_step


def run_and_kill(
    workdir: Path,
    url: str,
    stop_at: int | None,
    delay: float,
    extra: tuple[str, ...] = ("--wandb",),
    saved: int = 1,
) -> float | None:
    """Run the child; ``delay`` seconds after it reports batch ``stop_at`` with at least
    ``saved`` checkpoints on disk, SIGKILL it. Returns the seconds from its first batch to
    the kill."""
    child = _child(workdir, url, 5, *extra)
    assert child.stdout is not None and child.stderr is not None
    started: float | None = None
    timer = threading.Timer(400, child.kill)  # a hung child fails the test, never the suite
    timer.start()
    killed_after = None
    try:
        for line in child.stdout:
            words = line.split()
            if started is None and words[:1] == ["batch"]:
                started = time.monotonic()
            if stop_at is None or killed_after is not None or words[:1] != ["batch"]:
                continue
            if int(words[1]) >= stop_at and int(words[3]) >= saved:
                time.sleep(delay)  # a random moment inside the next batch
                child.send_signal(signal.SIGKILL)
                killed_after = time.monotonic() - (started or 0.0)
        child.wait()
        err = child.stderr.read()
    finally:
        timer.cancel()
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    if stop_at is None:
        assert child.returncode == 0, err
    else:
        assert killed_after is not None, f"the child finished before batch {stop_at}: {err}"
    return killed_after


@pytest.mark.slow  # 3 W&B processes and W&B's reader: ~40 s under load
@pytest.mark.timeout(900)
def test_default_wandb_keeps_every_step_once_across_random_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(key, value)  # the children inherit it
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    stops = [rng.randint(5, 14), rng.randint(20, 54)]  # after the first checkpoint (5)
    delays = [rng.uniform(0, 0.05) for _ in stops]
    workdir = tmp_path / "run"
    workdir.mkdir()
    server = MetricsServer()
    try:
        kills, left = [], []
        for stop, delay in zip(stops, delays, strict=True):
            kills.append(run_and_kill(workdir, server.url, stop, delay))
            newest = run_folders(workdir / "wb")[-1]  # what the killed process left W&B
            left.append(last_history_step(next(newest.glob("*.wandb"))))
        run_and_kill(workdir, server.url, None, 0.0)
    finally:
        server.close()
    print(
        f"seed {seed}: killed at batches {stops}, {kills} s after the first batch; the last "
        f"step in each killed process's .wandb file: {left}"
    )
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    jsonl = Counter(
        (r["name"], r["step"], r["value"]) for r in map(json.loads, lines) if r["kind"] == "metric"
    )
    assert set(jsonl.values()) == {1}
    assert sorted(s for n, s, _ in jsonl if n == "half") == list(range(1, TOTAL + 1))
    runs = wandb_points(workdir / "wb")
    assert len(runs) == 1, (seed, list(runs))  # the resumed runs log into the killed run
    assert len(run_folders(workdir / "wb")) == 3  # one offline folder per process
    (points,) = runs.values()
    got = Counter(points)
    twice = [p for p, n in got.items() if n > 1]
    assert not twice, (seed, twice)
    keys = Counter((n, s) for n, s, _ in got)
    missing = sorted(set((n, s) for n, s, _ in jsonl) - set(keys))
    assert not missing, (seed, missing[:10], len(missing))
    assert keys == Counter((n, s) for n, s, _ in jsonl), seed
    assert got == jsonl, seed  # the same values: a deterministic run, replayed exactly
