"""What ``RayReporter`` costs a batch that is not a report event (issue 44).

    python benchmarks/investigations/ray_bridge_cost.py [--batches 20 60]

Runs one process under ``valgrind --tool=callgrind --instr-atstart=no`` that fits the
suite's tiny workload (32-64-4, batch 16, on the CPU) with a ``CheckpointSaver`` and a no-op
destination, with and without a ``RayReporter`` beside them, each for B1 and B2 batches with
instrumentation on only around the fit, and prints the difference per batch (all threads:
the training thread's ``@blocking`` interval check and the reporter's lane, which keeps the
latest ``loss/train``). The saver saves every 1,000 epochs, so no batch is a report event:
what is left is the bridge's cost per batch. Fixed costs (fit start, the one report at
``FIT_END``, close) cancel in B2 - B1.

Three fits: without the reporter, with ``RayReporter(drain_notice=False)``, and with the
default ``RayReporter()``, whose drain notice adds the training loop's poll at each batch
boundary (``Preemption.poll`` -> ``RayReporter.pending_preemption``: one read of Ray's
``PreemptionContext.preemption_info``, here a real ``ray.train`` ``PreemptionContext`` with
no drain).

Ray itself is not running here: the reporter's one call into Ray (``_report``, on its own
thread, at report events only) is replaced by a no-op, the check that the process is a
Ray Train worker is skipped, and the worker's ``PreemptionContext`` is made here. At a report event the training thread copies the metrics and
queues them; the call (a barrier across the ranks, then the upload) is on the reporter's
thread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, subprocess, sys, tempfile
import torch
import trainbus
from trainbus.callbacks import CheckpointSaver
import trainbus.integrations.ray as bridge

from ray.train.v2._internal.execution.preemption import PreemptionContext

bridge._in_ray_worker = lambda: True  # no Ray here: see the module docstring
_context = PreemptionContext()  # Ray's own object, as a worker has it (no drain)
bridge._preemption_context = lambda: _context


class Offline(bridge.RayReporter):
    def _report(self, metrics, folder):
        pass


class Quiet(trainbus.LoggerDestination):
    def log_metrics(self, metrics, step):
        pass


def ctl(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)


def fit(batches, reporter, folder):  # reporter: None, "no drain" or "drain"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    data = [(torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in range(batches)]
    saver = CheckpointSaver(folder, save_interval="1000ep")
    loggers = [Quiet()]
    if reporter is not None:
        loggers.append(Offline(drain_notice=reporter == "drain"))
    trainer = trainbus.Trainer(model, data, "1ep", loss_fn=torch.nn.functional.cross_entropy,
                               callbacks=[saver], loggers=loggers, device="cpu")
    return trainer


b1, b2 = json.loads(sys.argv[1])
for reporter in (None, "no drain", "drain"):
    with tempfile.TemporaryDirectory() as folder:
        fit(10, reporter, folder).fit_sync()  # warm-up
        for batches in (b1, b2):
            trainer = fit(batches, reporter, folder + f"/{batches}")
            ctl("-i", "on")
            trainer.fit_sync()
            ctl("-i", "off")
            ctl("-d")

# The drain notice's poll alone, as the loop makes it at each batch boundary (dumps 7-10):
# N1 and N2 rounds of an empty loop, then of the loop's guard and poll (no drain).
with tempfile.TemporaryDirectory() as folder:
    trainer = fit(2, "drain", folder)
    reporter = trainer.state.callbacks[-1]
    reporter._preemption = _context  # what fit_start sets in a Ray worker
    state, poll = trainer.state, trainer._poll_notices
    assert poll is not None
    for polled in (False, True):
        for rounds in (b1 * 100, b2 * 100):
            ctl("-i", "on")
            if polled:
                for _ in range(rounds):
                    if poll is not None and state.preemption is None:
                        poll()
            else:
                for _ in range(rounds):
                    pass
            ctl("-i", "off")
            ctl("-d")
    assert state.preemption is None

    # The reporter's own handlers at a batch that is not a report event, on its lane: the
    # loss it keeps (log_metrics) and the interval it asks (batch_checkpoint); dumps 11-14.
    from trainbus.callbacks._interval import Interval

    reporter._interval = Interval("1000ep")  # what fit_start takes from the saver
    logger, loss = trainer.logger, {"loss/train": torch.tensor(0.5)}
    for rounds in (b1 * 100, b2 * 100):
        ctl("-i", "on")
        for step in range(rounds):
            reporter.log_metrics(loss, step)
            reporter.batch_checkpoint(state, logger)
        ctl("-i", "off")
        ctl("-d")
    assert reporter._reports.empty()  # no report was queued
    # ... and the same loop calling two no-op methods, to take the loop and calls off.
    class Noop:
        def log_metrics(self, metrics, step): pass
        def batch_checkpoint(self, state, logger): pass
    noop = Noop()
    for rounds in (b1 * 100, b2 * 100):
        ctl("-i", "on")
        for step in range(rounds):
            noop.log_metrics(loss, step)
            noop.batch_checkpoint(state, logger)
        ctl("-i", "off")
        ctl("-d")
"""


def totals(path: Path) -> tuple[int, bool]:
    """A dump's instruction total, and whether it is the training thread's (it ran addmm)."""
    text = path.read_text(errors="replace")
    match = re.search(r"^totals: (\d+)", text, re.M)
    return (int(match.group(1)) if match else 0), "addmm" in text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", nargs=2, type=int, default=[20, 60])
    args = parser.parse_args()
    b1, b2 = args.batches
    path = f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, "-c", CHILD, json.dumps([b1, b2])],
            check=True, env=dict(os.environ, PYTHONPATH=path), capture_output=True,
        )
        dumps: dict[int, list[tuple[int, bool]]] = {}
        for dump in Path(tmp).glob("cg.out.*"):
            number = int(dump.name.split(".")[-1].split("-")[0])
            dumps.setdefault(number, []).append(totals(dump))

    def figures(number: int) -> tuple[int, int]:
        threads = dumps.get(number, [])
        trained = [total for total, addmm in threads if addmm]
        return (max(trained) if trained else 0), sum(total for total, _ in threads)

    if sorted(dumps) != list(range(1, 15)):
        raise RuntimeError(f"expected dumps 1-14, got {sorted(dumps)}")
    (t1, a1), (t2, a2), (t3, a3), (t4, a4), (t5, a5), (t6, a6) = (
        figures(n) for n in range(1, 7)
    )
    n = b2 - b1
    base_t, base_a = (t2 - t1) / n, (a2 - a1) / n
    off_t, off_a = (t4 - t3) / n, (a4 - a3) / n
    on_t, on_a = (t6 - t5) / n, (a6 - a5) / n
    print(f"instructions per batch ({b1} -> {b2} batches): training thread / all threads")
    print(f"  saver + a no-op destination:           {base_t:11,.0f} / {base_a:11,.0f}")
    print(f"  + RayReporter(drain_notice=False):     {off_t:11,.0f} / {off_a:11,.0f}")
    print(f"  + RayReporter() (drain notice polled): {on_t:11,.0f} / {on_a:11,.0f}")
    print("  a batch that is not a report event, against the first line:")
    print(f"    RayReporter(drain_notice=False): {off_t - base_t:+,.0f} / {off_a - base_a:+,.0f}")
    print(f"    RayReporter():                   {on_t - base_t:+,.0f} / {on_a - base_a:+,.0f}")
    print(f"    the drain notice's poll alone:   {on_t - off_t:+,.0f} / {on_a - off_a:+,.0f}")
    (_, e1), (_, e2), (_, p1), (_, p2) = (figures(n) for n in range(7, 11))
    rounds = (b2 - b1) * 100
    print("the loop's drain poll at one batch boundary (guard + Preemption.poll + "
          f"RayReporter.pending_preemption, no drain; {b1 * 100} -> {b2 * 100} rounds, "
          f"an empty loop's rounds taken off): {((p2 - p1) - (e2 - e1)) / rounds:,.0f}")
    (_, h1), (_, h2), (_, n1), (_, n2) = (figures(n) for n in range(11, 15))
    print("the reporter's handler bodies at a batch that is not a report event (log_metrics "
          "of one loss + batch_checkpoint's interval check, on its lane; no-op methods' "
          f"calls taken off): {((h2 - h1) - (n2 - n1)) / rounds:,.0f}")


if __name__ == "__main__":
    main()
