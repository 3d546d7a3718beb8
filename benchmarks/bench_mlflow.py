"""Logging to MLflow during training: trainbus's MLflowLogger, Lightning's MLFlowLogger, MLflow's client.

Workload (benchmarks/workloads.py): MLP 256-512-10, batch 64, 200 batches (``--repeat k``:
200*k), CPU, one torch thread; every batch logs 10 metrics (benchmarks/mlflow_points.py).
Every scenario logs into a fresh run of one local ``mlflow server`` (sqlite store, started
by this script on 127.0.0.1, as the tests do). Repetitions are interleaved round by round,
each round in a rotated order. Scenarios (each ``+`` figure is paired with its base):

    plain            a hand-written loop, no logging                                  (base)
    client-sync      the same loop calling ``MlflowClient.log_batch(run_id, 10 metrics)``
                     after each batch, synchronous (what Lightning's logger calls)
    client-async     the same with ``synchronous=False``: MLflow's async logging queue
    pl-none          Lightning 2.6 (its venv; peers/run_lightning_mlflow.py): a callback
                     computes the 10 values, logs nothing; ``logger=False``           (base)
    pl-log           it logs them with ``pl_module.log_dict``; ``logger=False``
    pl-mlflow        the same with ``MLFlowLogger`` (synchronous), ``log_every_n_steps=1``
    pl-mlflow-async  the same with ``MLFlowLogger(synchronous=False)``
    tb-none          trainbus: a ``@blocking`` callback computes the 10 values, logs
                     nothing                                                           (base)
    tb-null          it logs them to a no-op ``async def log_record`` destination: the
                     bus's record path to a loop lane (one loop wake-up per record)
    tb-null-thread   the same with a plain ``def log_record``: the bus's record path to a
                     thread lane (MLflowLogger's, since it runs on one)
    tb-mlflow        it logs them to ``MLflowLogger`` (defaults: 1000 points per request,
                     flushed every second)
    tb-mlflow-stub   the same against a stub (a process of its own) that answers MLflow's
                     endpoints at once and stores nothing: no server CPU on the machine

Figures per scenario, per batch from the end of batch 1 to the end of the last batch, on
the training thread (median over repetitions [min-max]; ``+`` columns: median of the
per-repetition differences from the base run of the same round [min-max]):

    wall ms          wall clock
    train CPU ms     CPU time of the training thread (``time.thread_time``): the work
                     logging puts on the thread that trains, whatever the machine's load
    proc CPU ms      CPU time of the whole process (every thread: the event loop, httpx,
                     MLflow's async threads), i.e. all the client-side work of logging
    loop CPU ms      trainbus rows: CPU time of the event loop's thread
    fit ms           end of the last batch -> ``fit()`` returned (trainbus waits there for
                     delivery; Lightning ends the run; ``client-*``: ``set_terminated``)
    readable ms      end of the last batch -> every point readable in the server's store
    req              ``runs/log-batch`` requests per fit (trainbus rows; stub: and bytes
                     per point)

``--stub-only`` runs plain, tb-none, tb-null and tb-mlflow-stub and needs no ``mlflow``
package (for a quiet machine without it). Lightning rows need its venv with
``mlflow-skinny`` (``benchmarks/setup_peers.sh``, then
``benchmarks/.venvs/lightning/bin/pip install mlflow-skinny``); ``--no-lightning`` skips them.

Figures: see benchmarks/README.md, section "MLflow".

Run:  PYTHONPATH=src python benchmarks/bench_mlflow.py [--reps 5] [--repeat 1]
      PYTHONPATH=src python benchmarks/bench_mlflow.py --stub-only --reps 10 --repeat 5
(needs ``pip install mlflow`` but with ``--stub-only``; the server starts in tens of seconds)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import mlflow_points as mp  # noqa: E402

Row = dict[str, float]
DEVICE = "cpu"  # --device: where the plain and trainbus rows train
INSTRUMENT: tuple[int, int] | None = None  # --instrument A B (callgrind; trainbus rows)
TOGGLE: Callable[[bool], None] | None = None  # what INSTRUMENT calls (count_mlflow_calls.py)


# -- the stub server (a process of its own: ``--serve-stub``) ------------------------------------

class _Stub(BaseHTTPRequestHandler):
    """Answers the endpoints MLflowLogger calls at once, storing nothing; counts log-batch
    requests, their bytes and their metrics (``/stats``)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    ANSWERS: ClassVar[dict[str, bytes]] = {
        "get-by-name": b'{"experiment": {"experiment_id": "1"}}',
        "create": b'{"run": {"info": {"run_id": "stub"}}}',
    }
    counts: ClassVar[dict[str, int]] = {"requests": 0, "bytes": 0, "points": 0}

    def _answer(self) -> None:
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/stats"):
            body = json.dumps(self.counts).encode()
        else:
            body = next((v for k, v in self.ANSWERS.items() if k in self.path), b"{}")
            if "log-batch" in self.path:
                self.counts["requests"] += 1
                self.counts["bytes"] += len(data)
                self.counts["points"] += len(json.loads(data).get("metrics", []))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that closes its connection at exit is not news


def serve_stub() -> None:
    server = _Quiet(("127.0.0.1", 0), _Stub)
    print(server.server_address[1], flush=True)
    server.serve_forever()


class StubProcess:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-stub"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def counts(self) -> dict[str, int]:
        import httpx

        return dict(httpx.get(self.url + "/stats").json())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- scenarios -------------------------------------------------------------------------------------

def plain(w: Any, client: Any, db: str, exp: str, mode: str | None) -> Row:
    import torch  # noqa: F401

    meter = mp.Meter()
    run_id = ""
    if mode:
        from mlflow.entities import Metric

        run_id = client.create_run(exp).info.run_id
    opt = w.optimizer()
    model, loss_fn = w.model, w.loss_fn
    for step, (x, y) in enumerate(w.batches, 1):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if mode:
            stamp = int(time.time() * 1000)
            metrics = [Metric(k, v, stamp, step) for k, v in mp.values(step).items()]
            client.log_batch(run_id, metrics=metrics, synchronous=mode == "sync")
        meter.mark()
    row = meter.per_batch()
    if mode:
        client.set_terminated(run_id)
        row["fit_ms"] = (time.perf_counter() - row["t_last"]) * 1e3
        n = len(w.batches) * len(mp.KEYS)
        row["readable_ms"] = (mp.wait_readable(db, run_id, n) - row["t_last"]) * 1e3
    return row


def with_trainbus(w: Any, kind: str, url: str, exp: str, db: str | None,
                  stub: StubProcess | None) -> Row:
    import trainbus
    from trainbus import Callback, Trainer
    from trainbus.loggers import MLflowLogger

    class TenMetrics(Callback):
        def __init__(self, meter: mp.Meter, log: bool) -> None:
            self.meter, self.log = meter, log

        @trainbus.blocking  # on the training thread: its marks are the training thread's
        def batch_end(self, state: Any, logger: Any) -> None:
            metrics = mp.values(int(state.timer.batch))
            if self.log:
                logger.log_metrics(metrics)
            self.meter.mark()

    class NullDestination(trainbus.LoggerDestination):
        async def log_record(self, record: trainbus.LogRecord) -> None:
            return None

    class SyncNull(trainbus.LoggerDestination):
        def log_record(self, record: trainbus.LogRecord) -> None:
            return None

    loggers: list[trainbus.LoggerDestination] = []
    mlflow_logger = None
    if kind.startswith("mlflow"):
        mlflow_logger = MLflowLogger(url, experiment_name=exp)
        loggers.append(mlflow_logger)
    elif kind == "null":
        loggers.append(NullDestination())
    elif kind == "null-thread":
        loggers.append(SyncNull())
    meter = mp.Meter(INSTRUMENT, TOGGLE)
    meter.watch_this_thread()  # fit_sync runs the event loop on this thread
    before = stub.counts() if stub is not None else None
    Trainer(w.model, w.batches, "1ep", loss_fn=w.loss_fn, optimizers=w.optimizer(),
            callbacks=[TenMetrics(meter, log=kind != "none")], loggers=loggers, device=DEVICE,
            warn_slow_callbacks=False, log_train_loss=False).fit_sync()
    row = meter.per_batch()
    row["fit_ms"] = (time.perf_counter() - row["t_last"]) * 1e3
    if mlflow_logger is not None:
        row["req"] = mlflow_logger.statistics().batches_sent
        if db is not None:
            assert mlflow_logger.run_id is not None
            n = len(w.batches) * len(mp.KEYS)
            row["readable_ms"] = (mp.wait_readable(db, mlflow_logger.run_id, n)
                                  - row["t_last"]) * 1e3
    if stub is not None and before is not None:
        after = stub.counts()
        row["bytes_per_point"] = (after["bytes"] - before["bytes"]) / (
            len(w.batches) * len(mp.KEYS))
    return row


class LightningWorker:
    """peers/run_lightning_mlflow.py in the Lightning venv, one fit per command."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, str(HERE / "peers" / "run_lightning_mlflow.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = json.loads(self._read())["version"]

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Lightning worker exited ({self.proc.wait()})")
        return line

    def fit(self, **command: str) -> Row:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        row: Row = json.loads(self._read())
        return row

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


# -- the report ------------------------------------------------------------------------------------

BASES = {"plain": "plain", "client": "plain", "pl": "pl-none", "tb": "tb-none"}
ORDER = ["plain", "client-sync", "client-async", "pl-none", "pl-log", "pl-mlflow",
         "pl-mlflow-async", "tb-none", "tb-null", "tb-null-thread", "tb-mlflow", "tb-mlflow-stub"]
COLUMNS = [("wall", "wall ms"), ("train_cpu", "train CPU ms"), ("proc_cpu", "proc CPU ms")]


def _med(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"


def report(rows: dict[str, list[Row]], header: str) -> None:
    print(header)
    print(f"{'scenario':<16}" + "".join(f"{t:>22}{'+' + t.split()[0]:>24}" for _, t in COLUMNS)
          + f"{'loop CPU ms':>14}{'fit ms':>14}{'readable ms':>20}{'req':>6}")
    for name, runs in rows.items():
        base = rows[BASES[name.split("-")[0]]]
        line = f"{name:<16}"
        for key, _ in COLUMNS:
            mine = [r[key] for r in runs]
            paired = [a[key] - b[key] for a, b in zip(runs, base, strict=True)]
            extra = _med(paired, "+.3f") if runs is not base else ""
            line += f"{_med(mine):>22}{extra:>24}"
        loop = [r["loop_cpu"] for r in runs]
        line += f"{statistics.median(loop):>14.3f}" if any(loop) else f"{'':>14}"
        fit = [r.get("fit_ms", 0.0) for r in runs]
        line += f"{statistics.median(fit):>14.1f}" if any(fit) else f"{'':>14}"
        ready = [r.get("readable_ms", 0.0) for r in runs]
        line += f"{_med(ready, '.0f'):>20}" if any(ready) else f"{'':>20}"
        req = [r.get("req", 0.0) for r in runs]
        line += f"{statistics.median(req):>6.0f}" if any(req) else ""
        bpp = [r["bytes_per_point"] for r in runs if "bytes_per_point" in r]
        line += f"  {statistics.median(bpp):.0f} B/point" if bpp else ""
        print(line)


def compare(args: argparse.Namespace) -> None:
    """The stub rows against two trees in alternating subprocesses, round by round (ABAB)."""
    import os

    trees = {"before": args.before, "after": str(HERE.parent / "src")}
    command = [sys.executable, __file__, "--stub-only", "--json", "--reps", str(args.reps),
               "--repeat", str(args.repeat)]
    rounds: dict[str, list[dict[str, list[Row]]]] = {k: [] for k in trees}
    for _ in range(args.rounds):
        for tree, src in trees.items():
            out = subprocess.run(command, env={**os.environ, "PYTHONPATH": src}, check=True,
                                 capture_output=True, text=True, timeout=1800).stdout
            rounds[tree].append(json.loads(out.strip().splitlines()[-1]))
    def fig(row: Row, key: str) -> float:
        return row["proc_cpu"] - row["train_cpu"] if key == "other" else row[key]

    figures = [("wall", "wall"), ("train_cpu", "train CPU"), ("other", "other threads CPU")]
    print(f"ms per batch over tb-none (paired within each run: median over {args.reps} reps); "
          f"before | after, and after - before: min / median / max over {args.rounds} rounds")
    print(f"{'scenario':<16}{'figure':<19}{'+before':>9}{'+after':>9}{'after - before':>32}")
    for scenario in [n for n in rounds["after"][0] if n.startswith("tb-") and n != "tb-none"]:
        for key, label in figures:
            med: dict[str, list[float]] = {}
            for tree in trees:
                med[tree] = [statistics.median(
                    fig(a, key) - fig(b, key)
                    for a, b in zip(run[scenario], run["tb-none"], strict=True))
                    for run in rounds[tree]]
            diff = [a - b for a, b in zip(med["after"], med["before"], strict=True)]
            print(f"{scenario:<16}{label:<19}{statistics.median(med['before']):+9.3f}"
                  f"{statistics.median(med['after']):+9.3f}"
                  f"{min(diff):+12.3f} / {statistics.median(diff):+.3f} / {max(diff):+.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1, help="epoch = 200 * REPEAT batches")
    parser.add_argument("--stub-only", action="store_true", help="no mlflow server, no mlflow")
    parser.add_argument("--no-lightning", action="store_true")
    parser.add_argument("--lightning-python",
                        default=str(HERE / ".venvs" / "lightning" / "bin" / "python"))
    parser.add_argument("--device", default="cpu",
                        help="e.g. cuda: the plain and trainbus rows train there (no sync "
                             "per batch: a small MLP is bound by the CPU's launches)")
    parser.add_argument("--only", help="run only this scenario (and no warm-up): callgrind")
    parser.add_argument("--instrument", type=int, nargs=2, metavar=("A", "B"),
                        help="callgrind: instrument batches A+1..B only (see callgrind_mlflow)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--before", metavar="SRC",
                        help="compare the trainbus rows with the src/ folder of another tree")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of --before")
    parser.add_argument("--serve-stub", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_stub:
        serve_stub()
        return
    if args.before:
        compare(args)
        return
    if args.instrument:
        global INSTRUMENT
        INSTRUMENT = (args.instrument[0], args.instrument[1])
    import torch
    import workloads

    torch.set_num_threads(1)
    w = workloads.make_workload("mlp")
    w.batches = w.batches * args.repeat
    if args.device != "cpu":  # plain and trainbus rows only; the model and data live there
        global DEVICE
        DEVICE = args.device
        w.model.to(DEVICE)
        w.batches = [(x.to(DEVICE), y.to(DEVICE)) for x, y in w.batches]
        args.no_lightning = True
    name = f"bench-{uuid.uuid4().hex[:6]}"
    stub = StubProcess()
    table: dict[str, Callable[[], Row]] = {
        "plain": lambda: plain(w, None, "", "", None),
        "tb-none": lambda: with_trainbus(w, "none", stub.url, name, None, None),
        "tb-null": lambda: with_trainbus(w, "null", stub.url, name, None, None),
        "tb-null-thread": lambda: with_trainbus(w, "null-thread", stub.url, name, None, None),
        "tb-mlflow-stub": lambda: with_trainbus(w, "mlflow-stub", stub.url, name, None, stub),
    }
    versions = f"torch {torch.__version__}"
    server = worker = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if not args.stub_only:
                import mlflow
                from mlflow.tracking import MlflowClient
                from tests.loggers.mlflow_server import MLflowServer

                server = MLflowServer(Path(tmp))
                server.start()
                url, db = server.url, str(server.root / "mlflow.db")
                client = MlflowClient(tracking_uri=url)
                exp = client.create_experiment(name)
                versions += f", mlflow {mlflow.__version__} (server and client)"
                table.update({
                    "client-sync": lambda: plain(w, client, db, exp, "sync"),
                    "client-async": lambda: plain(w, client, db, exp, "async"),
                    "tb-mlflow": lambda: with_trainbus(w, "mlflow", url, name, db, None),
                })
                if not args.no_lightning:
                    lw = worker = LightningWorker(args.lightning_python)
                    versions += f", lightning {worker.version}"
                    for mode in ("none", "log", "mlflow", "mlflow-async"):
                        table[f"pl-{mode}"] = (lambda mode=mode: lw.fit(
                            mode=mode, url=url, experiment=name, db=db))
            order = [n for n in ORDER if n in table]
            if args.only:
                order = [args.only]
            for scenario in order if not args.only else ():  # warm-up
                table[scenario]()
            rows: dict[str, list[Row]] = {n: [] for n in order}
            for rep in range(args.reps):
                k = rep % len(order)
                for scenario in order[k:] + order[:k]:
                    rows[scenario].append(table[scenario]())
        finally:
            if worker is not None:
                worker.stop()
            if server is not None:
                server.stop()
            stub.stop()
    grouped = {n: rows[n] for n in ORDER if n in rows}
    if args.only:
        grouped = rows
    if args.json:
        print(json.dumps(grouped))
        return
    report(grouped, f"{len(w.batches)} batches of MLP 256-512-10, batch 64, {DEVICE}, 1 torch thread, "
                    f"10 metrics per batch; {versions}; {args.reps} reps, median [min-max]; "
                    "per batch")


if __name__ == "__main__":
    main()
