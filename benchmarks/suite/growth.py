"""Growth from 1 to 1,000 no-op callbacks: is the cost linear, the per-call cost flat?

Instructions per batch (all threads) with 1, 10 and 1,000 no-op callbacks on every
per-batch hook, for trainbus plain and ``async def``, Ignite and the plain loop. The
marginal cost of a call is taken over the callbacks 2-10, (cost(10) - cost(1)) / (9 calls
a batch each), and over the callbacks 11-1,000; the first callback's own cost, which holds
what having any callback costs a batch, is left out of both. Linear means the two agree:
their ratio r, as max(r, 1/r), at most 1.25. The per-call cost at 1 and at 1,000 callbacks
(as SPEC's row gives it) is printed beside.
"""

from __future__ import annotations

from typing import Any

from harness import stats
from harness.runner import LABELS, Context
from harness.stats import Count

from suite import _calls

FIGURE = "growth, 1 to 1,000 callbacks"
ARMS = (("trainbus_fw", "noop"), ("trainbus_fw", "noop-async"), ("ignite_fw", "noop"),
        ("plain", "noop"))
TARGET = 1.25


def top(quick: bool) -> int:
    """1,000 callbacks; 100 in ``--quick`` (1,000 threads take minutes under valgrind)."""
    return 100 if quick else 1000


def big_batches(quick: bool) -> list[int]:
    """Fits of 5 and 15 batches with 1,000 callbacks: the difference spans 10 batches, so
    a fit's uneven fixed cost (1,000 tasks started and ended) moves the figure a fifth as
    much as over 1 to 3 batches, where the same code read 12.0k and 17.2k a call."""
    return [1, 2] if quick else [5, 15]


def counts(quick: bool) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for adapter, kind in ARMS:
        out.setdefault(adapter, [_calls.config("noop", 0, quick)])
        out[adapter] += [_calls.config(kind, 1, quick), _calls.config(kind, 10, quick),
                         _calls.config(kind, top(quick), quick, big_batches(quick))]
    return out


def _marginal(ctx: Context, adapter: str, kind: str, lo: int, hi: int,
              b_hi: list[int] | None = None) -> Count:
    """Instructions per call of the callbacks lo+1..hi (all threads)."""
    a = ctx.count_all(adapter, _calls.config(kind, lo, ctx.quick))
    b = ctx.count_all(adapter, _calls.config(kind, hi, ctx.quick, b_hi))
    calls = (hi - lo) * _calls.CALLS_PER_CALLBACK[adapter]
    loaded = None if a.loaded is None or b.loaded is None else (b.loaded - a.loaded) / calls
    return Count((b.quiet - a.quiet) / calls, loaded)


def _ratio(first: Count, rest: Count) -> Count:
    def f(x: float, y: float) -> float:
        r = y / x
        return max(r, 1 / r)

    loaded = None if first.loaded is None or rest.loaded is None else f(first.loaded, rest.loaded)
    return Count(f(first.quiet, rest.quiet), loaded)


def run(ctx: Context) -> list[dict[str, Any]]:
    cells, data, verdicts, shorts = [], {}, [], []
    big = big_batches(ctx.quick)
    for adapter, kind in ARMS:
        label = LABELS[adapter] + ("" if adapter != "trainbus_fw" else f" {kind}")
        if reason := ctx.count_reason(adapter):
            cells.append(f"{label}: {reason}")
            continue
        n = top(ctx.quick)
        try:
            first = _marginal(ctx, adapter, kind, 1, 10)
            rest = _marginal(ctx, adapter, kind, 10, n, big)
            one = _calls.per_call(ctx, adapter, kind, 1, ctx.quick, True)
            many = _calls.per_call(ctx, adapter, kind, n, ctx.quick, True, big)
        except RuntimeError as exc:
            if adapter == "trainbus_fw":
                raise
            cells.append(f"{label}: {str(exc)[:200]}")
            continue
        ratio = _ratio(first, rest)
        cells.append(f"{label} {first.quiet:,.0f} a call over callbacks 2-10, "
                     f"{rest.quiet:,.0f} over 11-{n:,} ({ratio.quiet:.2f}x; per call at "
                     f"1: {one.quiet:,.0f}, at {n:,}: {many.quiet:,.0f})")
        data[f"{adapter}:{kind}"] = {"marginal_2_10": first.as_dict(),
                                     "marginal_11_top": rest.as_dict(), "top": n,
                                     "ratio": ratio.as_dict(), "per_call_1": one.as_dict(),
                                     "per_call_top": many.as_dict()}
        if adapter == "trainbus_fw":
            verdicts.append(stats.count_verdict(ratio, TARGET))
            shorts.append(f"{kind.removeprefix('noop-') if kind != 'noop' else 'plain'} "
                          f"{first.quiet:,.0f} -> {rest.quiet:,.0f} a call")
    verdict = (stats.MISSED if stats.MISSED in verdicts else stats.UNDECIDED
               if stats.UNDECIDED in verdicts else stats.MET)
    return [stats.row(FIGURE, f"linear: the marginal cost a call within {TARGET}x from "
                      f"callbacks 2-10 to 11-{top(ctx.quick):,}", "; ".join(cells), verdict,
                      short="; ".join(shorts),
                      unit="instructions per call, all threads", **data)]
