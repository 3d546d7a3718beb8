"""Paired figures from interleaved rounds (SPEC section 7): the arithmetic and the tables.

``run_all_peers.py`` runs every framework once per scenario in each round, in an order that
rotates from round to round, and keeps per round the median ms/batch of each run:
``rounds[i]["ms"]["trainbus/mlp/b"]``. A figure compares two runs *of the same round* (the
same machine state): trainbus(a) - plain(a), trainbus(b) - trainbus(a), trainbus(d) -
plain(d1), a ratio to the plain loop, us per handler call... and is reported over the rounds
as median, min and spread (max - min). A round where either side is missing (a failed run)
does not count. Stdlib only: ``run_all.py`` and the tests import it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FRAMEWORKS", "Paired", "base_scenario", "diff", "key", "over_rounds", "paired",
           "per_call", "per_call_table", "ratio", "scenario_table"]

#: Table order.
FRAMEWORKS = ("plain", "trainbus", "ignite", "lightning", "composer")

Rounds = Sequence[dict[str, Any]]


def key(framework: str, workload: str, scenario: str) -> str:
    """The name of one run in a round: ``"trainbus/mlp/b"``."""
    return f"{framework}/{workload}/{scenario}"


def base_scenario(scenario: str) -> str:
    """The plain-loop scenario a scenario is compared with: d1 for the d's (the plain loop
    that sleeps 5 ms per batch, SPEC section 7), else the letter (b-async -> b)."""
    return "d1" if scenario.startswith("d") else scenario.split("-")[0]


@dataclass(frozen=True)
class Paired:
    """One figure per round, each from two runs of the same round.

    Attributes:
        values: the figure of each round that has both runs, in round order.
    """

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        """The number of rounds behind the figure."""
        return len(self.values)

    @property
    def median(self) -> float:
        """The median over rounds: the figure a verdict uses."""
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        """The smallest figure over rounds (the least disturbed round, usually)."""
        return min(self.values)

    @property
    def max(self) -> float:
        """The largest figure over rounds."""
        return max(self.values)

    @property
    def spread(self) -> float:
        """max - min over rounds: how far the rounds disagree."""
        return self.max - self.min

    def cell(self, unit: str = "ms", sign: str = "+", digits: int = 3) -> str:
        """``+0.120 ms (min +0.050, spread 0.300, 6 rounds)``."""
        f = f"{sign}.{digits}f"
        return (f"{self.median:{f}} {unit} (min {self.min:{f}}, spread "
                f"{self.spread:.{digits}f}, {self.n} round{'s' if self.n != 1 else ''})")


def over_rounds(rounds: Rounds, keys: Sequence[str],
                fn: Callable[..., float]) -> Paired | None:
    """``fn(ms[k] for k in keys)`` per round that has every run; None if no round has them."""
    values = tuple(fn(*(r["ms"][k] for k in keys)) for r in rounds
                   if all(k in r["ms"] for k in keys))
    return Paired(values) if values else None


def paired(rounds: Rounds, a: str, b: str,
           op: Callable[[float, float], float]) -> Paired | None:
    """``op(ms[a], ms[b])`` per round that has both runs; None if no round has them."""
    return over_rounds(rounds, (a, b), op)


def diff(rounds: Rounds, a: str, b: str) -> Paired | None:
    """ms/batch of ``a`` minus ``b``, round by round."""
    return paired(rounds, a, b, lambda x, y: x - y)


def ratio(rounds: Rounds, a: str, b: str) -> Paired | None:
    """ms/batch of ``a`` over ``b``, round by round."""
    return paired(rounds, a, b, lambda x, y: x / y)


def per_call(rounds: Rounds, a: str, base: str, calls: int) -> Paired | None:
    """Microseconds per handler call: (ms/batch of ``a`` - ``base``) / ``calls``, per round."""
    if not calls:
        return None
    return paired(rounds, a, base, lambda x, y: (x - y) * 1e3 / calls)


def _by_key(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {key(r["framework"], r["workload"], r["scenario"]): r for r in results}


def scenario_table(results: list[dict[str, Any]], rounds: Rounds, workload: str) -> str:
    """One workload's table: every run's ms/batch over all repetitions of all rounds, and
    its paired difference and ratio to the plain loop of the same round."""
    by = _by_key(results)
    scenarios = list(dict.fromkeys(r["scenario"] for r in results if r["workload"] == workload))
    lines = ["| scenario | framework | median ms/batch (min-max) | vs plain loop, paired: "
             "median (min, spread) | ratio, paired: median (min-max) |", "|---|---|---|---|---|"]
    for sc in scenarios:
        base_sc = base_scenario(sc)
        plain = key("plain", workload, base_sc)
        for fw in FRAMEWORKS:
            r = by.get(key(fw, workload, sc))
            if r is None:
                continue
            ms = r["ms_per_batch"]
            d = q = None
            if not (fw == "plain" and sc == base_sc):
                d = diff(rounds, key(fw, workload, sc), plain)
                q = ratio(rounds, key(fw, workload, sc), plain)
            diff_cell = f"{d.cell()} vs plain {base_sc}" if d else ""
            ratio_cell = f"{q.median:.2f}x ({q.min:.2f}-{q.max:.2f}x)" if q else ""
            lines.append(f"| {sc} | {fw} {r['version']} | {statistics.median(ms):.3f} "
                         f"({min(ms):.3f}-{max(ms):.3f}) | {diff_cell} | {ratio_cell} |")
    return "\n".join(lines)


def per_call_table(results: list[dict[str, Any]], rounds: Rounds) -> str:
    """Microseconds per no-op handler call over the framework's own (a), MLP, paired."""
    by = _by_key(results)
    lines = ["| framework | scenario | handler calls/batch | us per call over its own (a), "
             "paired: median (min, spread) |", "|---|---|---|---|"]
    for fw in FRAMEWORKS:
        for sc in ("b", "b-async", "b-blocking", "c", "c-async"):
            r = by.get(key(fw, "mlp", sc))
            if r is None:
                continue
            calls = r["handler_calls_per_batch"]
            us = per_call(rounds, key(fw, "mlp", sc), key(fw, "mlp", "a"), calls)
            if us is not None:
                lines.append(f"| {fw} | {sc} | {calls} | {us.cell('us', '', 2)} |")
    return "\n".join(lines)
