"""The report's one HTML page: inline SVG and CSS, no script, nothing fetched.

Sections: the time account of the last fit (a table of its parts), the account per epoch
(one stacked bar each), the callbacks (time on the training thread, work off it, hidden
share, lag, queue peak), then one chart per metric: every logged point is a vertex of the
curve's ``polyline`` (its ``data-points`` says how many), and a dashed line marks each batch
a fit resumed from.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from trainbus.report._data import PARTS, RunData, epoch_shares

__all__ = ["render"]

#: One colour per part of the account (colour-blind-safe, Okabe-Ito first).
COLOURS = {
    "startup": "#999999", "data": "#E69F00", "compute": "#0072B2", "evaluation": "#56B4E9",
    "checkpoint": "#009E73", "callbacks": "#D55E00", "bus": "#CC79A7", "replayed": "#F0E442",
    "close": "#666666", "other": "#DDDDDD",
}
_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1000px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 32px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #e4e4e4; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 2px; }
.muted { color: #777; }
svg text { font: 11px system-ui, sans-serif; fill: #555; }
"""
W, H = 460, 220
L, R, T, B = 66, 12, 10, 28


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000 or magnitude < 0.01:
        return f"{value:.3g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def _chart(name: str, points: Sequence[tuple[int, float]], resumes: Sequence[int]) -> str:
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    steps = [s for s, _ in points]
    x0, x1 = (min(steps), max(steps)) if steps else (0, 1)
    if x1 == x0:
        x1 = x0 + 1
    values = [v for _, v in finite] or [0.0]
    y0, y1 = min(values), max(values)
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(step: float) -> float:
        return L + (step - x0) / (x1 - x0) * (W - L - R)

    def sy(value: float) -> float:
        return T + (1 - (value - y0) / (y1 - y0)) * (H - T - B)

    parts = [
        f'<svg class="chart" data-metric="{_e(name)}" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{_e(name)} by step">',
        f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="#fafafa" '
        'stroke="#ddd"/>',
    ]
    for tick in _ticks(y0, y1):
        y = sy(tick)
        parts.append(f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    for tick in _ticks(x0, x1):
        parts.append(
            f'<text x="{sx(tick):.1f}" y="{H - 10}" text-anchor="middle">{round(tick)}</text>'
        )
    for step in resumes:
        if x0 <= step <= x1:
            x = sx(step)
            parts.append(
                f'<line class="resume" data-step="{step}" x1="{x:.1f}" x2="{x:.1f}" y1="{T}" '
                f'y2="{H - B}" stroke="#D55E00" stroke-dasharray="4 3">'
                f"<title>resumed at batch {step}</title></line>"
            )
    coords = " ".join(f"{sx(s):.2f},{sy(v):.2f}" for s, v in finite)
    parts.append(
        f'<polyline class="curve" data-points="{len(finite)}" points="{coords}" fill="none" '
        'stroke="#0072B2" stroke-width="1.5"/>'
    )
    if len(finite) <= 60:  # few points (an eval metric): each is visible, with its value
        for s, v in finite:
            parts.append(
                f'<circle cx="{sx(s):.2f}" cy="{sy(v):.2f}" r="2.5" fill="#0072B2">'
                f"<title>step {s}: {_fmt(v)}</title></circle>"
            )
    parts.append("</svg>")
    last = f"last {_fmt(finite[-1][1])} at step {finite[-1][0]}" if finite else "no finite value"
    return (
        f'<figure><figcaption>{_e(name)} <span class="muted">({len(points)} points, '
        f"{last})</span></figcaption>{''.join(parts)}</figure>"
    )


def _legend(parts: Sequence[str]) -> str:
    return " ".join(
        f'<span><span class="swatch" style="background:{COLOURS[p]}"></span>{_e(p)}</span>'
        for p in parts
    )


def _epoch_bars(run: RunData) -> str:
    rows = epoch_shares(run)
    if not rows:
        return (
            '<p class="muted">No time account in this file: it is logged when the run '
            "shows its progress (the default; <code>progress=False</code> or "
            "<code>TRAINBUS_PROGRESS=0</code> turn it off).</p>"
        )
    used = [p for p in PARTS if any(share.get(p, 0.0) > 0 for _, share in rows)]
    bar_h, gap = 22, 8
    label_w, width = 120, 840
    most = max(sum(share.values()) for _, share in rows) or 1.0
    height = len(rows) * (bar_h + gap) + 4
    out = [
        f'<svg id="epochs" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'role="img" aria-label="the time account per epoch">'
    ]
    for i, (record, share) in enumerate(rows):
        y = i * (bar_h + gap)
        fit_note = f" (fit {record.fit})" if record.fit > 1 else ""
        out.append(
            f'<text x="0" y="{y + 15}">to batch {record.step}{_e(fit_note)}</text>'
        )
        x = float(label_w)
        total = sum(share.values())
        for part in used:
            seconds = share.get(part, 0.0)
            if seconds <= 0:
                continue
            w = seconds / most * (width - label_w - 70)
            out.append(
                f'<rect class="part" data-part="{part}" x="{x:.1f}" y="{y}" width="{w:.1f}" '
                f'height="{bar_h}" fill="{COLOURS[part]}"><title>{part}: {seconds:.3f} s '
                f"({seconds / total:.0%})</title></rect>"
            )
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{total:.2f} s</text>')
    out.append("</svg>")
    return f"<p>{_legend(used)}</p>{''.join(out)}"


def _account_table(run: RunData) -> str:
    if not run.accounts:
        return ""
    last = run.accounts[-1]
    values = last.values
    wall = values.get("wall", 0.0) or 1.0
    rows = "".join(
        f'<tr><td><span class="swatch" style="background:{COLOURS[p]}"></span>{p}</td>'
        f"<td>{values.get(p, 0.0):.3f} s</td><td>{values.get(p, 0.0) / wall:.1%}</td></tr>"
        for p in PARTS
        if values.get(p, 0.0) > 0 or p in ("compute", "data", "callbacks", "bus")
    )
    off, hidden = values.get("off_thread", 0.0), values.get("hidden", 0.0)
    share = hidden / off if off > 0 else 1.0
    return (
        f'<table id="account"><tr><th>part</th><th>time</th><th>share</th></tr>{rows}'
        f'<tr><td>wall (to batch {last.step})</td><td>{values.get("wall", 0.0):.3f} s</td>'
        f"<td></td></tr></table><p>Callback work off the training thread: {off:.3f} s, "
        f"{share:.0%} of it hidden behind training.</p>"
    )


def _callback_table(run: RunData) -> str:
    if not run.accounts or not run.accounts[-1].callbacks:
        return '<p class="muted">No callbacks.</p>'
    rows = []
    shown = {k: v for k, v in run.accounts[-1].callbacks.items() if not k.startswith("_")}
    for name, v in sorted(shown.items(), key=lambda kv: -kv[1].get("training_thread", 0.0)):
        off = v.get("off_thread", 0.0)
        share = f"{v.get('hidden', 0.0) / off:.0%}" if off > 0 else "-"
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{v.get('training_thread', 0.0):.3f} s</td>"
            f"<td>{off:.3f} s</td><td>{share}</td><td>{v.get('lag_batches', 0.0):.0f}</td>"
            f"<td>{v.get('peak_pending', 0.0):.0f}</td></tr>"
        )
    return (
        '<table id="callbacks"><tr><th>callback</th><th>on the training thread</th>'
        "<th>off it</th><th>hidden</th><th>lag (batches)</th><th>queue peak</th></tr>"
        + "".join(rows) + "</table>"
    )


def render(run: RunData) -> str:
    """The report page for ``run``."""
    charts = "".join(
        _chart(name, points, run.resumes) for name, points in sorted(run.curves.items())
    )
    resumes = (
        f"<p>Fits resumed at batch {', '.join(str(s) for s in run.resumes)} (dashed lines).</p>"
        if run.resumes else ""
    )
    skipped = f", {run.skipped} skipped" if run.skipped else ""
    title = f"trainbus report: {run.path.name}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{_CSS}</style></head><body>
<h1>{_e(title)}</h1>
<p class="muted">{_e(run.path)}: {run.points} points{skipped}.</p>{resumes}
<h2>Where the time went</h2>
<p class="muted">The last fit's time account, as of its last batch (the close after it is
not in the file). Each part is time of the training thread; see
docs/where-the-time-went.md.</p>
{_account_table(run)}
<h2>Per epoch</h2>
{_epoch_bars(run)}
<h2>Callbacks</h2>
{_callback_table(run)}
<h2>Metrics</h2>
<div class="charts">{charts or '<p class="muted">No metrics.</p>'}</div>
</body></html>
"""
