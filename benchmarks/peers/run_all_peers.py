"""Every peer x scenario x workload in interleaved rounds (SPEC section 7), then paired figures.

One long-lived worker per framework (``run_<peer>.py --serve`` on its own interpreter: plain
and trainbus on this Python, the others in the venvs made by benchmarks/setup_peers.sh), the
framework and torch imported once, driven over stdin/stdout (workloads.serve). A round runs,
for each scenario group (a, b, c, d, e: a scenario with its variants and, for d, the plain
loop's d1), every framework once, ``reps`` epochs each, in an order that rotates from round
to round, so no framework always runs first or last. Figures pair runs of the same round
(pairing.py): e.g. trainbus(a) - plain(a) per round, reported as median, min and spread
(max - min) over the rounds. A LatencyServer process (20 ms) serves the upload scenarios.

Cost on the 2-core benchmark machine (from the per-epoch times of a run there): an MLP
round about 85 s, the large workload 170 s more; the large workload runs every
``--large-every`` rounds. A new round starts only if it should end within ``--budget-s``
(its duration guessed from the last round of its kind), after at least 2 rounds. Defaults:
6 rounds, the large workload in rounds 1, 3 and 5, budget 1200 s; on that machine they come
to about 18 minutes (1,030 s of rounds, 45 s of warm-ups, 15-25 s to start the workers), so
the budget only cuts rounds when the machine is slower. Results: benchmarks/.out/peers.json.

    python benchmarks/peers/run_all_peers.py                 # full run, about 18 min
    python benchmarks/peers/run_all_peers.py --quick         # smoke run: 2 rounds of a, b (+ b-blocking), MLP
    python benchmarks/peers/run_all_peers.py --peers plain,ignite --workloads mlp --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pairing

BENCH = Path(__file__).resolve().parents[1]
OUT = BENCH / ".out" / "peers.json"
PEERS = {
    "plain": Path(sys.executable),
    "trainbus": Path(sys.executable),
    "lightning": BENCH / ".venvs/lightning/bin/python",
    "ignite": BENCH / ".venvs/ignite/bin/python",
    "composer": BENCH / ".venvs/composer/bin/python",
}
# workload -> (scenario, epochs per run). d1 (the plain loop's 5 ms-sleep baseline for d)
# runs on plain only; scenarios with a dash are trainbus's own variants (async twins,
# @blocking, max_lag=1). The cheap MLP scenarios get 3 epochs per run (their round figure is
# the median), the ones that sleep or wait for the server 1.
FULL = {
    "mlp": [("a", 3), ("b", 3), ("b-async", 3), ("b-blocking", 3), ("c", 3), ("c-async", 3),
            ("d1", 1), ("d", 1), ("d-async", 1), ("d-lag1", 1), ("e", 1), ("e-async", 1)],
    "large": [("a", 1), ("d1", 1), ("d", 1), ("d-async", 1), ("d-lag1", 1), ("e", 1)],
}
QUICK = {"mlp": [("a", 2), ("b", 2), ("b-blocking", 2)]}
READY_TIMEOUT_S = 300
RUN_TIMEOUT_S = 1800


def runs_on(peer: str, scenario: str) -> bool:
    """d1 is the plain loop's baseline; dashed scenarios exist only for trainbus."""
    if scenario == "d1":
        return peer == "plain"
    if "-" in scenario:
        return peer == "trainbus"
    return True


def round_order(plan: list[tuple[str, int]], peers: list[str],
                index: int) -> list[tuple[str, str, int]]:
    """``(peer, scenario, reps)`` in the order round ``index`` runs them (one workload).

    Scenario groups (by letter; d1 is in d's) run in plan order; within a group the runs
    rotate by one place per round (and per group), so each framework takes each place.
    """
    groups: dict[str, list[tuple[str, str, int]]] = {}
    for scenario, reps in plan:
        group = groups.setdefault(scenario[0], [])
        group.extend((peer, scenario, reps) for peer in peers if runs_on(peer, scenario))
    order: list[tuple[str, str, int]] = []
    for g, runs in enumerate(groups.values()):
        k = (index + g) % len(runs)
        order += runs[k:] + runs[:k]
    return order


class Worker:
    """One framework's ``--serve`` process; stderr goes to a log file."""

    def __init__(self, peer: str, log_dir: Path) -> None:
        self.peer = peer
        self.log_path = log_dir / f"worker-{peer}.log"
        self.log = self.log_path.open("w")
        try:
            self.proc = subprocess.Popen(
                [str(PEERS[peer]), str(BENCH / "peers" / f"run_{peer}.py"), "--serve"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                bufsize=1, cwd=BENCH.parent)
        except OSError:
            self.log.close()
            raise
        self.hello: dict[str, Any] | None = None

    def ready(self) -> dict[str, Any]:
        """The worker's hello line, once it has imported everything."""
        if self.hello is None:
            self.hello = self._read(READY_TIMEOUT_S)
        return self.hello

    def run(self, workload: str, scenario: str, reps: int, url: str) -> dict[str, Any]:
        """One command: ``reps`` epochs of ``scenario``; the worker's result."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"workload": workload, "scenario": scenario,
                                          "reps": reps, "upload_url": url}) + "\n")
        self.proc.stdin.flush()
        answer = self._read(RUN_TIMEOUT_S)
        if not answer.get("ok"):
            raise RuntimeError(answer.get("error", answer))
        return answer

    def _read(self, timeout: float) -> dict[str, Any]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else ""
        if not line:
            self.log.flush()
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"{self.peer} worker {'timed out' if not ready else 'died'} "
                               f"(exit {self.proc.poll()}): {tail}")
        return json.loads(line)  # type: ignore[no-any-return]

    def stop(self) -> None:
        """Ask the worker to stop (it exits once its current command is done)."""
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write('{"cmd": "quit"}\n')
                self.proc.stdin.close()
            except OSError:  # it died already
                pass

    def close(self) -> None:
        """Stop the worker; kill it if it has not exited within 10 s."""
        self.stop()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()


def run_one(peer: str, workload: str, scenario: str, reps: int, url: str) -> dict[str, Any]:
    """One standalone run in its own process (not interleaved; compare_handler_calls.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(PEERS[peer]), str(BENCH / "peers" / f"run_{peer}.py"), "--scenario", scenario,
               "--workload", workload, "--reps", str(reps), "--json", str(out), "--upload-url", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if proc.returncode or not out.exists():
            raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
        print("  " + proc.stdout.strip().splitlines()[-1], flush=True)
        return {**json.loads(out.read_text()), "loadavg_1min": os.getloadavg()[0]}


def aggregate(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per run key over all rounds (every repetition; ``round_ms`` per round)."""
    results: dict[str, dict[str, Any]] = {}
    for i, rnd in enumerate(rounds):
        for k, r in rnd["runs"].items():
            agg = results.setdefault(k, {**r, "ms_per_batch": [], "setup_ms": [],
                                         "round_ms": [None] * len(rounds)})
            agg["ms_per_batch"] += r["ms_per_batch"]
            agg["setup_ms"] += r["setup_ms"]
            agg["round_ms"][i] = rnd["ms"][k]
    for agg in results.values():
        agg.pop("ok", None)
        agg.pop("warmup_batches", None)
    return list(results.values())


def tables(results: list[dict[str, Any]], rounds: list[dict[str, Any]]) -> str:
    """The per-workload tables and the per-call table (pairing.py)."""
    parts = [f"### {wk}\n\n{pairing.scenario_table(results, rounds, wk)}"
             for wk in dict.fromkeys(r["workload"] for r in results)]
    return "\n\n".join([*parts, pairing.per_call_table(results, rounds)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds of QUICK (a, b and b-blocking on MLP)")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--workloads", default="mlp,large")
    parser.add_argument("--scenarios", help="comma-separated; default: all of the plan")
    parser.add_argument("--reps", type=int, help="epochs per run (default: the plan's, 3 or 1)")
    parser.add_argument("--rounds", type=int, help="at most this many rounds (default 6; 2 "
                        "with --quick)")
    parser.add_argument("--large-every", type=int, default=2,
                        help="the large workload runs in rounds 1, 1+N, 1+2N... (default 2)")
    parser.add_argument("--budget-s", type=float, default=1200.0,
                        help="start no round that would end after this (default 1200 s)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    max_rounds = args.rounds or (2 if args.quick else 6)
    wanted = set(args.scenarios.split(",")) if args.scenarios else None
    workloads = [wk for wk in args.workloads.split(",") if plan.get(wk)]
    plans = {wk: [(sc, args.reps or reps) for sc, reps in plan[wk]
                  if not wanted or sc in wanted] for wk in workloads}
    peers = args.peers.split(",")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    t0, load0 = time.monotonic(), os.getloadavg()
    server = subprocess.Popen([sys.executable, str(BENCH / "latency_server.py"), "--port", "0",
                               "--latency-ms", "20"], stdout=subprocess.PIPE, text=True)
    rounds: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    workers: dict[str, Worker] = {}
    for peer in peers:
        try:
            workers[peer] = Worker(peer, args.out.parent)
        except OSError as exc:  # no venv: bash benchmarks/setup_peers.sh
            print(f"  FAILED: {peer}: {exc}", flush=True)
            failures.append({"peer": peer, "error": str(exc)})
    stopped_by_budget = False
    try:
        url = (server.stdout.readline() if server.stdout else "").strip()
        for peer, worker in list(workers.items()):
            try:
                hello = worker.ready()
                print(f"{peer} {hello['version']} worker ready "
                      f"({time.monotonic() - t0:.1f} s)", flush=True)
            except Exception as exc:  # keep going: one broken peer must not stop the run
                print(f"  FAILED: {exc}", flush=True)
                failures.append({"peer": peer, "error": str(exc)})
                worker.close()
                del workers[peer]
        last_wall: dict[tuple[str, ...], float] = {}
        for i in range(max_rounds):
            kind = tuple(wk for wk in workloads if wk != "large" or i % args.large_every == 0)
            guess = last_wall.get(kind, max(last_wall.values(), default=0.0))
            if i >= 2 and time.monotonic() - t0 + guess > args.budget_s:
                stopped_by_budget = True
                print(f"budget: round {i + 1} (about {guess:.0f} s) would end after "
                      f"{args.budget_s:.0f} s; stopping", flush=True)
                break
            start = time.monotonic()
            rnd: dict[str, Any] = {"index": i, "workloads": list(kind), "order": [],
                                   "ms": {}, "runs": {}}
            for wk in kind:
                for peer, sc, reps in round_order(plans[wk], list(workers), i):
                    k, worker = pairing.key(peer, wk, sc), workers.get(peer)
                    if worker is None:  # it died or hung earlier in this round
                        continue
                    try:
                        r = worker.run(wk, sc, reps, url)
                    except Exception as exc:  # keep going: one broken run must not stop it
                        print(f"  FAILED {k}: {exc}", flush=True)
                        failures.append({"peer": peer, "workload": wk, "scenario": sc,
                                         "round": i, "error": str(exc)})
                        if worker.proc.poll() is not None or "timed out" in str(exc):
                            workers.pop(peer).close()  # its next answer would be out of step
                        continue
                    rnd["order"].append(k)
                    rnd["runs"][k] = r
                    rnd["ms"][k] = statistics.median(r["ms_per_batch"])
                    print(f"round {i + 1} {k}: {rnd['ms'][k]:.3f} ms/batch "
                          f"(x{reps}, warm-up {r['warmup_batches']} batches)", flush=True)
            rnd["wall_s"] = round(time.monotonic() - start, 1)
            rnd["loadavg_1min"] = os.getloadavg()[0]
            last_wall[kind] = rnd["wall_s"]
            rounds.append(rnd)
    finally:
        for worker in workers.values():
            worker.stop()  # all at once: each takes about a second to exit
        for worker in workers.values():
            worker.close()
        server.terminate()
        server.wait()
    results = aggregate(rounds)
    table = tables(results, rounds)
    args.out.write_text(json.dumps({
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "quick": args.quick,
                    # other processes skew timings: the 1/5/15-min load average before and after
                    "loadavg_before": load0, "loadavg_after": os.getloadavg()},
        "plan": plans, "budget_s": args.budget_s, "max_rounds": max_rounds,
        "large_every": args.large_every, "stopped_by_budget": stopped_by_budget,
        "wall_s": round(time.monotonic() - t0, 1), "rounds": rounds, "results": results,
        "failures": failures, "table": table,
    }, indent=1) + "\n")
    print(f"\n{table}\n\nwrote {args.out} ({len(rounds)} rounds, {len(results)} runs, "
          f"{len(failures)} failures, {time.monotonic() - t0:.0f} s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
