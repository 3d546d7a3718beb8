"""Run the benchmark suite (one benchmark per SPEC section 7 row) and write the report.

    python benchmarks/run.py                  # the full suite (about 20 minutes here)
    python benchmarks/run.py --quick          # every row, smaller: a smoke test (< 5 min)
    python benchmarks/run.py --only growth,sleepers   # some rows
    python benchmarks/run.py --report-only    # rewrite the README from results/latest.json
    python benchmarks/run.py --update-readme  # also replace the table in the top README
    python benchmarks/run.py --trainbus-src ../before/src --out /tmp/before   # another tree

Results go to ``benchmarks/results/<commit>-<mode>.json`` and ``results/latest.json``;
``benchmarks/README.md`` and ``results/readme_table.md`` are written from them. Peers run
from ``benchmarks/.venvs/`` (``bash benchmarks/setup_peers.sh``); a missing one is named in
its rows. ``--peers none`` (or a comma list of ignite, lightning, composer) limits them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from harness import report, runner  # noqa: E402
from harness.runner import LABELS, PEERS, Context  # noqa: E402
from suite import MODULES  # noqa: E402


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=BENCH, capture_output=True, text=True)
    return proc.stdout.strip()


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores"


def loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _terminated(signum: int, frame: Any) -> None:
    runner.kill_children()
    raise SystemExit(f"terminated by signal {signum}")  # so the workers are closed


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every row, smaller and faster")
    parser.add_argument("--only", help="comma-separated benchmark modules (suite/*.py)")
    parser.add_argument("--peers", help="comma list of ignite,lightning,composer, or none")
    parser.add_argument("--out", type=Path, default=BENCH, help="where README.md and results/ go")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--reuse-counts", action="store_true",
                        help="take the instruction counts from results/latest.json (no callgrind)")
    parser.add_argument("--update-readme", action="store_true",
                        help="replace <!-- perf-table --> ... in the top-level README.md")
    parser.add_argument("--trainbus-src", type=Path,
                        help="measure the trainbus of another checkout (its src/ folder), for a "
                             "before/after comparison; use with --out")
    args = parser.parse_args(argv)
    if args.trainbus_src is not None:
        runner.TRAINBUS_SRC = args.trainbus_src.resolve()
    results_dir = args.out / "results"
    latest = results_dir / "latest.json"
    if args.report_only:
        results = json.loads(latest.read_text())
    else:
        previous = json.loads(latest.read_text()) if latest.exists() else None
        results = run_suite(args, previous)
        results_dir.mkdir(parents=True, exist_ok=True)
        commit = results["meta"]["commit"].replace(" (dirty)", "-dirty")
        name = f"{commit}-{results['meta']['mode']}.json"
        for path in (results_dir / name, latest):
            path.write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "README.md").write_text(report.readme(results))
    table = report.short_table(results)
    (results_dir / "readme_table.md").write_text(table)
    print(f"wrote {args.out / 'README.md'} and {results_dir / 'readme_table.md'}")
    if args.update_readme:
        top = BENCH.parent / "README.md"
        if not report.update_readme(top, table):
            print(f"{top} has no <!-- perf-table --> ... <!-- /perf-table --> markers")
            return 1
    return 0


def run_suite(args: argparse.Namespace, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Run the selected benchmarks. With ``--only``, the other rows (and counts) of the
    previous results are kept, each with the date of its own run."""
    started, load_start = time.perf_counter(), loadavg()
    # what is measured: the tree at the start
    commit = git("-C", str(runner.TRAINBUS_SRC), "rev-parse", "--short", "HEAD")
    ctx = Context(quick=args.quick, log=lambda m: print(m, flush=True))
    if args.peers is not None:
        keep = {p for p in args.peers.split(",") if p and p != "none"}
        for adapter, name in PEERS.items():
            if name not in keep:
                ctx.availability[adapter] = "left out of this run (--peers)"
    names = args.only.split(",") if args.only else list(MODULES)
    modules = {n: importlib.import_module(f"suite.{n}") for n in names}
    plan: dict[str, list[dict[str, Any]]] = {}
    for mod in modules.values():
        if hasattr(mod, "counts"):
            for adapter, configs in mod.counts(args.quick).items():
                plan.setdefault(adapter, []).extend(configs)
    errors: dict[str, str] = {}
    adapters = {label: a for a, label in LABELS.items()}
    if previous and (args.reuse_counts or args.only):
        for c in previous.get("counts", []):
            adapter = adapters[c["framework"]]
            ctx.counts[(adapter, c["config"], False)] = c["quiet"]
            if c.get("loaded"):
                ctx.counts[(adapter, c["config"], True)] = c["loaded"]
    if not args.reuse_counts:
        for adapter, configs in plan.items():  # measured again
            for config in configs:
                key = json.dumps(config, sort_keys=True)
                ctx.counts.pop((adapter, key, False), None)
                ctx.counts.pop((adapter, key, True), None)
        print(f"callgrind: {sum(map(len, plan.values()))} configs", flush=True)
        try:
            ctx.prefetch_counts(plan)
        except Exception:
            errors["callgrind"] = traceback.format_exc()
            print(errors["callgrind"], flush=True)
    rows: list[dict[str, Any]] = []
    try:
        for name, mod in modules.items():
            t0 = time.perf_counter()
            kind = "instructions" if hasattr(mod, "counts") else "wall"
            try:
                new = mod.run(ctx)
            except Exception:
                errors[name] = traceback.format_exc()
                print(errors[name], flush=True)
                new = [{"figure": mod.FIGURE, "target": "", "measured": "failed: "
                        + errors[name].strip().splitlines()[-1], "verdict": "failed",
                        "data": {}}]
            for r in new:
                r.update(kind=kind, module=name, seconds=time.perf_counter() - t0,
                         date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"))
                print(f"{name}: {r['figure']}: {r['measured'][:140]} -> {r['verdict']}",
                      flush=True)
            rows += new
    finally:
        ctx.close()
    if previous and args.only:
        kept = [r for r in previous["rows"] if r.get("module") not in modules]
        for r in kept:
            r.setdefault("date", previous["meta"]["date"])
        order = {name: i for i, name in enumerate(MODULES)}
        rows = sorted(kept + rows, key=lambda r: order.get(r.get("module", ""), 99))
        errors = {**{m: e for m, e in previous.get("errors", {}).items() if m not in modules},
                  **errors}
    for adapter in ("plain", "trainbus_fw", *PEERS):
        ctx.missing(adapter)  # imports it once: its version
    counts = [{"framework": LABELS[a], "config": k,
               "quiet": v, "loaded": ctx.counts.get((a, k, True))}
              for (a, k, loaded), v in ctx.counts.items() if not loaded]
    versions = {LABELS[a]: v for a, v in ctx.versions.items()}
    versions.update({LABELS[a]: r for a, r in ctx.availability.items() if r})
    dirty = " (dirty)" if git("-C", str(runner.TRAINBUS_SRC), "status", "--porcelain", "--", ".") else ""
    meta = {
        "command": " ".join(["python benchmarks/run.py", *(sys.argv[1:] if args is not None else [])]),
        "mode": "quick" if args.quick else "full",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "commit": commit + dirty,
        "machine": machine(), "python": platform.python_version(),
        "loadavg": {"start": load_start, "end": loadavg()},
        "seconds": time.perf_counter() - started, "versions": versions,
    }
    if previous and args.only:  # the kept rows came from the previous run (and its own)
        before = previous["meta"]
        own, _, older = before["command"].partition("; other rows: ")
        meta["command"] += f"; other rows: {own} ({before['date']}, {before['commit']})"
        if older:
            meta["command"] += f"; {older}"
        meta["seconds"] += previous["meta"]["seconds"]
    return {"meta": meta, "rows": rows, "counts": counts, "errors": errors}


if __name__ == "__main__":
    raise SystemExit(main())
