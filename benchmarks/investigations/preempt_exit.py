"""Where a preempted run's seconds go, up to the process's exit (issue 40's 8 s bound).

    python benchmarks/investigations/preempt_exit.py [--busy 6]

Two timelines, each from a child process whose output lines are time-stamped here:

1. ``import torch``, then exit: the seconds from the child's ``atexit`` hook to its exit,
   that is Python tearing torch down (nothing in the process bounds it but a ``SIGKILL``).
2. ``tests/failures/scripts/preempt_stuck.py`` with ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT=8``,
   ``Preemption()`` and a plain handler stuck for 90 s: SIGTERM when it is stuck, then each
   stderr line of trainbus (the watchdog, the checkpoint, the closing line), the child's
   ``atexit`` hook and its exit status, in seconds after the signal.

``--busy N`` starts N busy Python processes beside them (a loaded machine). Wall clock on a
shared machine: run it a few times.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUCK = ROOT / "tests" / "failures" / "scripts" / "preempt_stuck.py"
#: Run before the child's own code: a line when ``atexit`` runs (the start of the exit).
HOOK = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('ATEXIT', file=sys.stderr, flush=True))\n"
)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return env


def teardown() -> None:
    code = HOOK + "import torch\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), text=True,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stderr is not None
    at = None
    for line in proc.stderr:
        if line.startswith("ATEXIT"):
            at = time.monotonic()
    proc.wait()
    if at is not None:
        print(f"import torch, then exit: {time.monotonic() - at:.2f} s from atexit to exit")


def stuck_stop() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        code = HOOK + f"import runpy, sys\nsys.argv = {[str(STUCK), tmp]!r} + sys.argv[1:]\n"
        code += f"runpy.run_path({str(STUCK)!r}, run_name='__main__')\n"
        env = dict(_env(), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="8")
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--stuck", "plain", "--grace", "0"], env=env,
            cwd=tmp, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert proc.stdout is not None
        sent = None
        for line in proc.stdout:
            now = time.monotonic()
            if sent is None and line.strip() == "stuck":
                sent = now
                proc.send_signal(signal.SIGTERM)
                print("   0.00 s  SIGTERM (the handler is stuck)")
            elif sent is not None and (line.startswith(("trainbus:", "ATEXIT"))):
                print(f"  {now - sent:5.2f} s  {line.strip()[:110]}")
        status = proc.wait()
        if sent is not None:
            print(f"  {time.monotonic() - sent:5.2f} s  exit status {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the runs")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]  # fmt: skip
    try:
        teardown()
        print("a plain handler stuck for 90 s, TORCH_ELASTIC_SHUTDOWN_TIMEOUT=8:")
        stuck_stop()
    finally:
        for p in busy:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
