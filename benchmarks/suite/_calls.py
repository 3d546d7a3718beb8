"""What the per-call instruction rows share: configs, per-call figures, the peers' cells."""

from __future__ import annotations

from typing import Any

from harness.runner import LABELS, PEERS, Context
from harness.stats import Count

#: handler calls per batch of one no-op callback, per framework (their per-batch hooks)
CALLS_PER_CALLBACK = {"plain": 12, "trainbus_fw": 12, "ignite_fw": 4, "lightning_fw": 6,
                      "composer_fw": 13}
FLOOR_AND_PEERS = ("plain", *PEERS)


def batches(quick: bool) -> list[int]:
    return [3, 6] if quick else [10, 30]


def config(scenario: str, n: int, quick: bool, b: list[int] | None = None) -> dict[str, Any]:
    return {"scenario": scenario, "n": n, "batches": b or batches(quick)}


def plan(quick: bool, *kinds: str) -> dict[str, list[dict[str, Any]]]:
    """n=0 and n=10 for every framework, plus trainbus's ``kinds``."""
    out = {a: [config("noop", 0, quick), config("noop", 10, quick)] for a in FLOOR_AND_PEERS}
    out["trainbus_fw"] = [config("noop", 0, quick), *(config(k, 10, quick) for k in kinds)]
    return out


def per_call(ctx: Context, adapter: str, scenario: str, n: int, quick: bool,
             all_threads: bool, b: list[int] | None = None) -> Count:
    """Instructions per handler call: (per batch with n callbacks - with none) / calls."""
    get = ctx.count_all if all_threads else ctx.count
    with_n = get(adapter, config(scenario, n, quick, b))
    none = get(adapter, config("noop", 0, quick))
    calls = n * CALLS_PER_CALLBACK[adapter]
    loaded = None
    if with_n.loaded is not None and none.loaded is not None:
        loaded = (with_n.loaded - none.loaded) / calls
    return Count((with_n.quiet - none.quiet) / calls, loaded)


def fmt(count: Count) -> str:
    text = f"{count.quiet:,.0f}"
    if count.loaded is not None:
        moved = count.moved or 0.0
        text += f" (beside a neighbour {count.loaded:,.0f}, {moved:+.1%})"
    return text


def peers_cell(ctx: Context, quick: bool, all_threads: bool) -> tuple[str, dict[str, Any]]:
    """The floor's and each peer's per-call count, or why a peer did not run."""
    cells, data = [], {}
    for adapter in FLOOR_AND_PEERS:
        if reason := ctx.count_reason(adapter):
            cells.append(f"{LABELS[adapter]}: {reason}")
            continue
        try:
            c = per_call(ctx, adapter, "noop", 10, quick, all_threads)
        except RuntimeError as exc:  # its callgrind process failed: the row says so
            cells.append(f"{LABELS[adapter]}: {str(exc)[:200]}")
            continue
        cells.append(f"{LABELS[adapter]} {fmt(c)}")
        data[adapter] = c.as_dict()
    return "; ".join(cells), data


def ignite_call(ctx: Context, quick: bool) -> Count | None:
    if ctx.count_reason("ignite_fw"):
        return None
    try:
        return per_call(ctx, "ignite_fw", "noop", 10, quick, all_threads=True)
    except RuntimeError:
        return None


def defect_note(*counts: Count) -> str:
    bad = [c for c in counts if c.load_defect]
    return " **moves with load (> 5%): a defect of the code**" if bad else ""
