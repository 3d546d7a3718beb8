"""Each rank's step time and data wait, gathered beside training: rank zero names the slowest.

At every batch boundary of a distributed ``fit()`` the loop calls :class:`RankTimes` on the
training thread with the time its batch came out of the data loader; it adds the step (the
time since the previous boundary) and the data wait (the part of it spent getting the batch)
to this rank's sums: two clock reads and a few additions. Every ``every`` batches it waits
for the ``all_gather`` it started ``every`` batches before (it ran beside those batches, so
the wait is normally over at once, as the stop agreement's is) and starts the next one with
this interval's means, on a gloo group of its own (a CPU tensor; created at the fit's start
on every rank, destroyed at its end).

Rank zero then reports each rank's figures (``ranks/step_seconds/rank<r>``,
``ranks/data_seconds/rank<r>``, ``ranks/slowest``, ``ranks/slowest_ratio``: logged through the
trainer's logger) and names the slowest rank. In synchronous data-parallel training every
rank's step ends together (the gradients' all-reduce waits for the last rank), so the step
time alone cannot name it; what differs is how long each rank took before it could join:
a rank's *own time* is its step minus the time it waited for the slowest rank's data
(``step - (max data wait - its data wait)``). The slowest rank is the one with the longest
own time, and its ratio is that time over the median rank's. A rank whose ratio stays at or
above ``ratio`` for ``patience`` reports in a row gets one :class:`SlowRankWarning` naming
it and its host. Nothing here changes what the run does.

Set by the environment of the launch (every rank the same):
``TRAINBUS_RANK_TIMES_EVERY`` (batches between two gatherings, default 100; ``0`` turns the
gathering off) and ``TRAINBUS_SLOW_RANK_RATIO`` (default 1.25).
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainbus.core.exceptions import SlowRankWarning
from trainbus.runtime.distributed import DistInfo

__all__ = [
    "DEFAULT_EVERY",
    "DEFAULT_PATIENCE",
    "DEFAULT_RATIO",
    "RankFigures",
    "RankTimes",
    "RankTimesConfig",
    "SlowRankWarning",
]

#: Batches between two gatherings (and two reports on rank zero).
DEFAULT_EVERY = 100
#: A rank whose own time is this many times the median rank's is slow ...
DEFAULT_RATIO = 1.25
#: ... when it is so in this many reports in a row.
DEFAULT_PATIENCE = 3
EVERY_VAR = "TRAINBUS_RANK_TIMES_EVERY"
RATIO_VAR = "TRAINBUS_SLOW_RANK_RATIO"


@dataclass(frozen=True, slots=True)
class RankTimesConfig:
    """How often ranks' times are gathered, and when a rank counts as slow."""

    every: int = DEFAULT_EVERY
    ratio: float = DEFAULT_RATIO
    patience: int = DEFAULT_PATIENCE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RankTimesConfig | None:
        """The launch's settings (module doc); ``None`` when the gathering is off.

        Raises:
            ValueError: A variable holds something else than what it takes.
        """
        env = os.environ if environ is None else environ
        every_text = env.get(EVERY_VAR, str(DEFAULT_EVERY))
        ratio_text = env.get(RATIO_VAR, str(DEFAULT_RATIO))
        try:
            every = int(every_text)
            if every < 0:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{EVERY_VAR}={every_text!r} must be a whole number of batches >= 0, e.g. "
                "100 (0 turns the per-rank step times off)"
            ) from None
        try:
            ratio = float(ratio_text)
            if not ratio > 1.0 or ratio == float("inf"):
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{RATIO_VAR}={ratio_text!r} must be a number > 1, e.g. 1.25 (a rank 25% "
                "slower than the median one is named)"
            ) from None
        return cls(every=every, ratio=ratio) if every else None


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One gathering, as rank zero reports it (seconds are means over the interval).

    Attributes:
        batch: The batch count when the gathering started.
        step: Each rank's step time.
        data: Each rank's data wait.
        own: Each rank's own time (module doc).
        slowest: The rank with the longest own time.
        ratio: Its own time over the median rank's.
        hosts: Each rank's host name.
    """

    batch: int
    step: tuple[float, ...]
    data: tuple[float, ...]
    own: tuple[float, ...]
    slowest: int
    ratio: float
    hosts: tuple[str, ...]

    @classmethod
    def of(cls, batch: int, rows: list[list[float]], hosts: tuple[str, ...]) -> RankFigures:
        """The figures of gathered rows ``[step, data, batches]``, one per rank."""
        step = tuple(r[0] for r in rows)
        data = tuple(r[1] for r in rows)
        worst = max(data)
        own = tuple(max(s - (worst - d), 0.0) for s, d in zip(step, data, strict=True))
        slowest = max(range(len(own)), key=own.__getitem__)
        median = statistics.median(own)
        ratio = own[slowest] / median if median > 0 else 1.0
        return cls(batch, step, data, own, slowest, ratio, hosts)

    def metrics(self) -> dict[str, float]:
        """The figures as metrics (``ranks/...``), as rank zero logs them."""
        out: dict[str, float] = {"ranks/slowest": float(self.slowest),
                                 "ranks/slowest_ratio": self.ratio}  # fmt: skip
        for rank, (step, data) in enumerate(zip(self.step, self.data, strict=True)):
            out[f"ranks/step_seconds/rank{rank}"] = step
            out[f"ranks/data_seconds/rank{rank}"] = data
        return out

    def describe(self, rank: int) -> str:
        """A sentence about ``rank`` for a human."""
        return (
            f"rank {rank} on host {self.hosts[rank]} holds the others back: its own time "
            f"{self.own[rank] * 1e3:.1f} ms a step is {self.ratio:.2f}x the median rank's "
            f"(data wait {self.data[rank] * 1e3:.1f} ms, step {self.step[rank] * 1e3:.1f} ms, "
            f"around batch {self.batch})"
        )


class RankTimes:
    """Gathers each rank's step time and data wait every ``config.every`` batches
    (training thread; module doc).

    Example:
        >>> times = RankTimes.create(info, RankTimesConfig(every=50), report=print)
        >>> times(fetched)  # at each batch boundary, every rank
    """

    def __init__(
        self,
        group: Any,
        info: DistInfo,
        config: RankTimesConfig,
        hosts: tuple[str, ...],
        report: Callable[[RankFigures], None] | None = None,
    ) -> None:
        self.group = group
        self.info = info
        self.config = config
        self.hosts = hosts
        self.report = report
        # Invariant: the training thread alone touches what follows.
        self._prev: float | None = None
        self._step = self._data = 0.0
        self._n = self._count = 0
        self._pending: tuple[Any, list[torch.Tensor], int] | None = None
        self._streak: dict[int, int] = {}
        self._warned: set[int] = set()

    @classmethod
    def create(
        cls,
        info: DistInfo,
        config: RankTimesConfig | None,
        report: Callable[[RankFigures], None] | None = None,
    ) -> RankTimes | None:
        """The gathering of a distributed ``fit()`` (a collective: every rank calls it at
        the same point), else ``None``."""
        if config is None or not info.distributed:
            return None
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.new_group(backend="gloo")
        hosts: list[Any] = [None] * info.world_size
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        return cls(group, info, config, tuple(str(h) for h in hosts), report)

    def __call__(self, fetched: float) -> None:
        """A batch boundary: ``fetched`` is ``time.perf_counter()`` when its batch came out
        of the data loader."""
        now = time.perf_counter()
        prev, self._prev = self._prev, now
        if prev is not None:
            self._step += now - prev
            self._data += max(fetched - prev, 0.0)
            self._n += 1
        self._count += 1
        if self._count % self.config.every:
            return
        self._finish()
        n = self._n
        mine = torch.tensor([self._step / n if n else 0.0, self._data / n if n else 0.0, n],
                            dtype=torch.float64)  # fmt: skip
        self._step = self._data = 0.0
        self._n = 0
        rows = [torch.empty(3, dtype=torch.float64) for _ in range(self.info.world_size)]
        work = dist.all_gather(rows, mine, group=self.group, async_op=True)
        self._pending = (work, rows, self._count)

    def _finish(self) -> None:
        """Wait for the gathering started at the last interval; rank zero reports it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        work, rows, batch = pending
        work.wait()
        if self.info.rank != 0:
            return
        figures = RankFigures.of(batch, [r.tolist() for r in rows], self.hosts)
        if self.report is not None:
            self.report(figures)
        slow = figures.slowest if figures.ratio >= self.config.ratio else None
        self._streak = {slow: self._streak.get(slow, 0) + 1} if slow is not None else {}
        if slow is not None and slow not in self._warned and (
            self._streak[slow] >= self.config.patience
        ):
            self._warned.add(slow)
            warnings.warn(figures.describe(slow), SlowRankWarning, stacklevel=2)

    def close(self, *, ended: bool) -> None:
        """The fit ended (training thread; ``ended``: on every rank, without a raise): the
        last gathering is waited for and reported, then the group goes. After a raise the
        pending one and the group are left to the process's exit (a peer may never join)."""
        if not ended:
            return
        self._finish()
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(ValueError):  # already destroyed (with every group)
                dist.destroy_process_group(group)
