"""Counted under callgrind by ``suite/rank_times.py``: the training thread's calls of
:class:`RankTimes` and of ``StopAgreement.step`` at ``N`` batch boundaries, then ``2N``, each
between ``callgrind_control -i on`` and a dump (one process, a gloo group of one rank: the
calls start their collectives as under torchrun; the peers' side is not in this count)."""

from __future__ import annotations

import sys
import tempfile
import time

import torch.distributed as dist
from harness.worker import ctl

from trainbus.runtime.distributed import DistInfo, StopAgreement
from trainbus.runtime.rank_times import RankTimes, RankTimesConfig


def main(n: int) -> None:
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0,
                                world_size=1)  # fmt: skip
        info = DistInfo(rank=0, world_size=1)
        times = RankTimes(dist.new_group(backend="gloo"), info, RankTimesConfig(every=100),
                          ("localhost",))  # fmt: skip
        agreement = StopAgreement(dist.new_group(backend="gloo"))
        calls = {"rank_times": lambda: times(time.perf_counter()),
                 "stop_agreement": lambda: agreement.step([0, 0, 0, 0], last=False)}  # fmt: skip
        for call in calls.values():
            for _ in range(300):  # warm-up: first-call paths, a few gatherings
                call()
            for count in (n, 2 * n):
                ctl("-i", "on")
                for _ in range(count):
                    call()
                ctl("-i", "off")
                ctl("-d")
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
