"""A measuring process: ``python -m harness.worker serve|callgrind ADAPTER [options]``.

``serve``: a long-lived timing worker for one framework (imported once). One JSON object
per line: on start it writes ``{"ready": true, "version": ...}``; for each command
``{"workload", "scenario", "n", "batches", "reps", "url"}`` it runs one untimed warm-up
epoch over 20 batches, then ``reps`` epochs, and writes ``{"ok": true, "ms": [ms per batch
per rep], "calls": handler calls per batch}`` or ``{"ok": false, "error": ...}``. The clock
runs from the first batch fetch to ``fit`` returning (construction and fit start excluded).

``callgrind``: run under ``valgrind --tool=callgrind --instr-atstart=no``: for each of
``--configs`` one warm-up fit, then a fit of B1 and one of B2 batches with instrumentation
on only around each, dumped after it (the runner divides the difference by B2 - B1, so the
fixed costs of a fit cancel); a ``run_event`` config counts N and 2N calls of
``trainer.engine.run_event(Event.BATCH_START)`` from plain code (trainbus only).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

from harness import workload as wl


def adapter(name: str) -> Any:
    return importlib.import_module(f"harness.frameworks.{name}")


def time_epochs(mod: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    w = wl.make_workload(cmd["workload"], int(cmd["batches"]))
    fit, calls = mod.make_fit(w, cmd["scenario"], int(cmd["n"]), cmd.get("url"))
    ms = []
    for rep in range(-1, int(cmd["reps"])):
        data = wl.TimedBatches(w.batches if rep >= 0 else w.batches[:20])
        gc.collect()
        cleanup = fit(data)
        end = time.perf_counter()
        if callable(cleanup):
            cleanup()
        assert data.t_first is not None
        if rep >= 0:
            ms.append((end - data.t_first) * 1e3 / len(data))
    return {"ok": True, "ms": ms, "median": statistics.median(ms), "calls": calls}


def serve(name: str) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a framework's prints must not break the protocol
    mod = adapter(name)
    proto.write(json.dumps({"ready": True, "version": mod.VERSION, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        try:
            out = time_epochs(mod, cmd)
        except Exception:
            out = {"ok": False, "error": traceback.format_exc()}
        proto.write(json.dumps(out) + "\n")


def ctl(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)


def callgrind(name: str, configs: list[dict[str, Any]]) -> None:
    """Each config ``{"scenario", "n", "batches": [B1, B2]}`` (or ``{"run_event": N, "n"}``)
    gives two dumps, in order: instrumentation is on only around each measured fit."""
    mod = adapter(name)
    for config in configs:
        if config.get("run_event"):
            import trainbus

            w = wl.make_workload("tiny", 4)
            cls = mod.noop_class("noop")
            trainer = trainbus.Trainer(w.model, w.batches, "1ep", loss_fn=w.loss_fn,
                                       callbacks=[cls() for _ in range(config["n"])],
                                       device="cpu")
            for _ in range(30):
                trainer.engine.run_event(trainbus.Event.BATCH_START)
            for calls in (config["run_event"], 2 * config["run_event"]):
                ctl("-i", "on")
                for _ in range(calls):
                    trainer.engine.run_event(trainbus.Event.BATCH_START)
                ctl("-i", "off")
                ctl("-d")
            trainer.engine.close()
            continue
        b1, b2 = config["batches"]
        w = wl.make_workload(config.get("workload", "tiny"), max(b2, 10))
        fit, calls = mod.make_fit(w, config["scenario"], config["n"], None)
        # warm-up: imports, caches, first-call paths (one batch for 1,000 callbacks)
        cleanup = fit(wl.TimedBatches(w.batches[:1 if config["n"] >= 1000 else 10]))
        if callable(cleanup):
            cleanup()
        for batches in (b1, b2):
            gc.collect()
            ctl("-i", "on")
            cleanup = fit(wl.TimedBatches(w.batches[:batches]))  # a list: Lightning's many loaders
            ctl("-i", "off")
            ctl("-d")
            if callable(cleanup):
                cleanup()
    print(json.dumps({"version": mod.VERSION}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("serve", "callgrind"))
    parser.add_argument("adapter")
    parser.add_argument("--configs", default="[]", help="callgrind: a JSON list of configs")
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.adapter)
    else:
        callgrind(args.adapter, json.loads(args.configs))


if __name__ == "__main__":
    main()
