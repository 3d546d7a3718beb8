"""Workloads, callback scenarios and timing shared by every benchmark runner.

Stdlib + torch only, so each peer's venv can import it::

    sys.path.insert(0, "<repo>/benchmarks"); import workloads

Workloads (one torch thread, 200 batches of 64 generated with a fixed seed and
kept in memory, SGD lr 0.01, cross-entropy):

- ``mlp``: Linear 256->512, ReLU, Linear 512->10 (plain loop: 0.52 ms/batch on
  the 2-core benchmark machine);
- ``large``: Linear 256->2048, ReLU, Linear 2048->2048, ReLU, Linear 2048->10
  (plain loop: 22-23 ms/batch there; hidden 1920 would give 18.7 ms).

Scenarios (framework-neutral; each runner maps them onto its own callbacks):
a) none; b) 10 and c) 100 no-op callbacks on every per-batch event; d) 4
callbacks each blocking ``time.sleep(0.005)`` at batch end; e) one metrics
upload per batch, a synchronous HTTP POST to a server with 20 ms latency.
The plain loop also runs d1, the honest baseline for d (SPEC section 7): one
5 ms sleep per batch, since a loop that idles computes slower after each gap.

Timing: one untimed warm-up epoch (in a ``--serve`` worker: a full epoch the first time a
workload runs, 20 batches for each further new scenario, nothing for a scenario it ran
before), then per repetition the wall time from the
first batch fetch to ``fit()`` returning, divided by 200 (so the trainer's
construction and fit start are left out, reported apart as ``setup_ms``; its
end-of-fit work is included).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import statistics
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

N_BATCHES = 200
BATCH_SIZE = 64
SEED = 0
WORKLOADS = {"mlp": (256, 512, 10), "large": (256, 2048, 2048, 10)}

# The 12 per-batch events of Composer's training loop (one microbatch); the plain
# loop calls its hooks at these points, in this order.
PER_BATCH_POINTS = (
    "after_dataloader", "batch_start", "before_train_batch", "before_forward",
    "after_forward", "before_loss", "after_loss", "before_backward",
    "after_backward", "after_train_batch", "batch_end", "batch_checkpoint",
)


@dataclass(frozen=True)
class Scenario:
    key: str
    description: str
    n_callbacks: int = 0
    action: str = "noop"  # noop: every per-batch event; sleep / upload: batch end only


SCENARIOS = {
    "a": Scenario("a", "no callbacks"),
    "b": Scenario("b", "10 no-op callbacks on every per-batch event", 10),
    "c": Scenario("c", "100 no-op callbacks on every per-batch event", 100),
    "d": Scenario("d", "4 callbacks each blocking time.sleep(0.005) at batch end", 4, "sleep"),
    "e": Scenario("e", "synchronous HTTP POST of the loss per batch (20 ms server)", 1, "upload"),
}
PLAIN_SCENARIOS = {
    **SCENARIOS,
    "d1": Scenario("d1", "baseline for d: one time.sleep(0.005) per batch", 1, "sleep"),
}


def noop(*args: Any, **kwargs: Any) -> None:
    return None


def sleep_5ms(*args: Any, **kwargs: Any) -> None:
    time.sleep(0.005)


def post_metrics(url: str, step: int, loss: float) -> None:
    """POST one point in trainbus's wire format and wait for the answer (urllib, no pooling)."""
    point = {"name": "loss", "value": loss, "step": step, "wall_time": time.time()}
    body = json.dumps({"run": "bench", "points": [point]}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


@dataclass
class Workload:
    name: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]

    loss_fn = staticmethod(F.cross_entropy)

    def optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.01)


def make_workload(name: str = "mlp") -> Workload:
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    dims = WORKLOADS[name]
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(dims):
        if layers:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(fan_in, fan_out))
    gen = torch.Generator().manual_seed(SEED)
    batches = [
        (torch.randn(BATCH_SIZE, dims[0], generator=gen),
         torch.randint(0, dims[-1], (BATCH_SIZE,), generator=gen))
        for _ in range(N_BATCHES)
    ]
    return Workload(name, nn.Sequential(*layers), batches)


def plain_fit(w: Workload, data: Any, opt: torch.optim.Optimizer,
              hooks: dict[str, list[Callable[[Any], None]]] | None = None) -> None:
    """One epoch of a hand-written loop; ``hooks`` maps PER_BATCH_POINTS to plain functions."""
    model, loss_fn = w.model, w.loss_fn
    if not hooks:
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        return
    state = SimpleNamespace(step=0, loss=None)
    h = [hooks.get(point, []) for point in PER_BATCH_POINTS]

    def fire(i: int) -> None:
        for fn in h[i]:
            fn(state)

    for x, y in data:
        fire(0)
        fire(1)
        fire(2)
        opt.zero_grad(set_to_none=True)
        fire(3)
        out = model(x)
        fire(4)
        fire(5)
        state.loss = loss = loss_fn(out, y)
        fire(6)
        fire(7)
        loss.backward()
        fire(8)
        opt.step()
        fire(9)
        state.step += 1
        fire(10)
        fire(11)


class TimedBatches:
    """The workload's batches as a re-iterable that notes when the first one is fetched."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches
        self.t_first: float | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i, batch in enumerate(self.batches):
            if i == 0 and self.t_first is None:
                self.t_first = time.perf_counter()
            yield batch


def measure(fit_epoch: Callable[[TimedBatches], Any], w: Workload, reps: int,
            setup_ms: list[float] | None = None, warmup_batches: int = N_BATCHES) -> list[float]:
    """Warm up, then ms per batch of ``fit_epoch(data)`` (one epoch over data) per rep.

    The warm-up is one untimed epoch over the first ``warmup_batches`` batches (none
    when 0). The clock runs from the first batch fetch to ``fit_epoch`` returning; the
    time before the first fetch (trainer construction, fit start) is appended to
    ``setup_ms`` when given. ``fit_epoch`` may return a callable: untimed clean-up,
    run after the clock stops.
    """
    results = []
    for rep in range(-1 if warmup_batches else 0, reps):
        data = TimedBatches(w.batches if rep >= 0 else w.batches[:warmup_batches])
        gc.collect()
        start = time.perf_counter()
        cleanup = fit_epoch(data)
        end = time.perf_counter()
        if callable(cleanup):
            cleanup()
        assert data.t_first is not None, "the runner never iterated the data"
        if rep >= 0:
            results.append((end - data.t_first) * 1e3 / len(data))
            if setup_ms is not None:
                setup_ms.append((data.t_first - start) * 1e3)
    return results


def parse_args(doc: str, scenarios: dict[str, Scenario] = SCENARIOS) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(scenarios), default="a")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the result to this file")
    parser.add_argument("--upload-url", help="server for scenario e (default: start one here)")
    parser.add_argument("--serve", action="store_true",
                        help="be a worker: one JSON command per stdin line (see serve())")
    args = parser.parse_args()
    args.spec = scenarios[args.scenario]
    return args


@contextlib.contextmanager
def upload_url(spec: Scenario, url: str | None) -> Iterator[str | None]:
    """The URL the upload scenarios post to: ``url``, or an in-process 20 ms LatencyServer."""
    if not spec.action.startswith("upload") or url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from latency_server import LatencyServer

    with LatencyServer(latency_ms=20) as server:
        yield server.url


def result(framework: str, version: str, workload: str, scenario: str, ms: list[float],
           calls_per_batch: int, setup_ms: list[float] | None = None) -> dict[str, Any]:
    """One runner's result in the format every benchmark script reads."""
    return {
        "framework": framework, "version": version, "scenario": scenario,
        "workload": workload, "ms_per_batch": [round(m, 5) for m in ms],
        "setup_ms": [round(m, 3) for m in setup_ms or []],
        "handler_calls_per_batch": calls_per_batch, "torch": torch.__version__,
    }


def report(args: argparse.Namespace, framework: str, version: str, ms: list[float],
           calls_per_batch: int, setup_ms: list[float] | None = None) -> dict[str, Any]:
    """Print a one-line summary and write the JSON result if --json was given."""
    out = result(framework, version, args.workload, args.scenario, ms, calls_per_batch,
                 setup_ms)
    print(f"{framework} {version} {args.workload}/{args.scenario}: median "
          f"{statistics.median(ms):.3f} ms/batch (min {min(ms):.3f}, max {max(ms):.3f}, "
          f"{len(ms)} reps, {calls_per_batch} handler calls/batch)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


#: A runner's measurement: ``bench(workload, scenario, upload_url, reps, warmup_batches)``
#: -> (ms per batch per rep, setup ms per rep, handler calls per batch).
Bench = Callable[[Workload, Scenario, str | None, int, int],
                 tuple[list[float], list[float], int]]

#: Warm-up of a scenario a worker has not run yet, once its workload is warm (a full epoch
#: the first time a workload runs in the worker; nothing for a scenario it ran before).
SCENARIO_WARMUP_BATCHES = 20


def run_main(doc: str, framework: str, version: str, bench: Bench,
             scenarios: dict[str, Scenario] = SCENARIOS) -> None:
    """A runner's command line: one scenario standalone, or ``--serve`` (a worker)."""
    args = parse_args(doc, scenarios)
    if args.serve:
        serve(framework, version, bench, scenarios)
        return
    w = make_workload(args.workload)
    with upload_url(args.spec, args.upload_url) as url:
        ms, setup_ms, calls = bench(w, args.spec, url, args.reps, N_BATCHES)
    report(args, framework, version, ms, calls, setup_ms)


def serve(framework: str, version: str, bench: Bench, scenarios: dict[str, Scenario]) -> None:
    """A long-lived worker: the framework is imported once, the coordinator drives it.

    Protocol (one JSON object per line): on start the worker writes ``{"ready": true,
    "framework", "version", "torch", "pid"}``; then for each command line on stdin
    ``{"workload": "mlp", "scenario": "b", "reps": 3, "upload_url": "http://..."}`` it runs
    the scenario and writes ``{"ok": true, **result(...), "warmup_batches": n}`` or ``{"ok":
    false, "error": traceback}``. It stops at end of input or ``{"cmd": "quit"}``. The
    protocol has the real stdout to itself: whatever else prints goes to stderr.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a framework's prints must not break the protocol
    warm: set[tuple[str, str]] = set()

    def send(message: dict[str, Any]) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    send({"ready": True, "framework": framework, "version": version,
          "torch": torch.__version__, "pid": os.getpid()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        try:
            workload, scenario = cmd["workload"], cmd["scenario"]
            spec = scenarios[scenario]
            warmup = (0 if (workload, scenario) in warm else SCENARIO_WARMUP_BATCHES
                      if any(wk == workload for wk, _ in warm) else N_BATCHES)
            w = make_workload(workload)
            with upload_url(spec, cmd.get("upload_url")) as url:
                ms, setup_ms, calls = bench(w, spec, url, int(cmd["reps"]), warmup)
            warm.add((workload, scenario))
            send({"ok": True, "warmup_batches": warmup,
                  **result(framework, version, workload, scenario, ms, calls, setup_ms)})
        except Exception:
            send({"ok": False, "error": traceback.format_exc()})
