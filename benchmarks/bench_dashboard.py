"""Training ms/batch with the dashboard open in a browser versus closed (issue 19).

The demo's model and data (``DigitsMLP`` on scikit-learn's digits, batch 32, AdamW, one
torch thread) with a ``Dashboard`` attached in every arm:

- ``closed``: nobody looks at the page;
- ``open``:   a headless Chromium tab (Debian's ``chromium``, via Playwright) follows the
              page live, charts, callbacks panel and timeline drawing;
- ``none``:   no Dashboard at all (for reference: the callback's own cost).

Rounds are interleaved (the order rotates each round) and each round trains ``--epochs``
epochs per arm; the figure is the paired ratio open/closed per round (min, median,
spread), the target being at most +2%.

With ``--screenshot PATH`` it first runs ``trainbus demo``'s training with the page open and
saves a screenshot of the page at the end (``docs/dashboard.png``).

Run:  PYTHONPATH=src python benchmarks/bench_dashboard.py [--rounds 7] [--epochs 6]
      PYTHONPATH=src python benchmarks/bench_dashboard.py --rounds 0 --screenshot docs/dashboard.png
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

import torch

from trainbus import Trainer
from trainbus._demo import DigitsMLP, load_digits_loaders, run_demo
from trainbus.callbacks import Dashboard

CHROMIUM = os.environ.get("TRAINBUS_CHROMIUM", "/usr/bin/chromium")


def in_thread(fn: Any) -> None:
    """Run ``fn`` on another thread (Playwright's sync API owns this one's loop)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def train_once(arm: str, epochs: int, browser: Any) -> float:
    """Train ``epochs`` epochs; returns ms per batch of ``fit()``."""
    train, _ = load_digits_loaders(seed=0)
    torch.manual_seed(0)
    model = DigitsMLP()
    board = Dashboard() if arm != "none" else None
    trainer = Trainer(model, train, f"{epochs}ep",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
                      loggers=[board] if board else [], device="cpu",
                      warn_slow_callbacks=False)
    page = None
    try:
        if board is not None:
            board.start()
            if arm == "open":
                page = browser.new_page()
                page.goto(board.url)
                page.wait_for_function("window.trainbusDashboard.status === 'live'")
        elapsed: list[float] = []

        def fit() -> None:
            t0 = time.perf_counter()
            trainer.fit_sync()
            elapsed.append(time.perf_counter() - t0)

        in_thread(fit)
        if page is not None:  # the page kept up: it has every batch's loss
            page.wait_for_function("window.trainbusDashboard.ended !== null")
            got = page.evaluate("window.trainbusDashboard.loss.count")
            assert got == len(train) * epochs, (got, len(train) * epochs)
        return elapsed[0] * 1e3 / (len(train) * epochs)
    finally:
        if page is not None:
            page.close()
        if board is not None:
            board.stop()


def screenshot(path: str, browser: Any) -> None:
    with Dashboard() as board:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(board.url)
        with open(os.devnull, "w") as quiet:
            in_thread(lambda: run_demo(epochs=3, out="runs/demo", dashboard=board, stream=quiet))
        page.wait_for_function("window.trainbusDashboard.ended !== null")
        page.wait_for_timeout(300)  # let the last frame paint
        page.screenshot(path=path, full_page=True)
        page.close()
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--screenshot", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        if args.screenshot:
            screenshot(args.screenshot, browser)
        if args.rounds <= 0:
            return
        arms = ["closed", "open", "none"]
        train_once("closed", 1, browser)  # warm-up: imports, first compile of kernels
        results: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(args.rounds):
            order = arms[r % 3 :] + arms[: r % 3]
            for arm in order:
                results[arm].append(train_once(arm, args.epochs, browser))
            print(f"round {r + 1}: " + "  ".join(
                f"{a} {results[a][-1]:.3f}" for a in arms), flush=True)
        browser.close()

    def summary(xs: list[float]) -> str:
        return f"min {min(xs):.3f}  median {statistics.median(xs):.3f}  max {max(xs):.3f}"

    print(f"\nms/batch over {args.rounds} interleaved rounds of {args.epochs} epochs "
          f"(torch threads: 1, python {sys.version.split()[0]})")
    for arm in arms:
        print(f"  {arm:7s} {summary(results[arm])}")
    ratios = [o / c for o, c in zip(results["open"], results["closed"], strict=True)]
    base = [c / n for c, n in zip(results["closed"], results["none"], strict=True)]
    print(f"  open/closed (paired): {summary(ratios)}  -> median "
          f"{(statistics.median(ratios) - 1) * 100:+.1f}% (target <= +2%)")
    print(f"  closed/none (paired): {summary(base)}  -> median "
          f"{(statistics.median(base) - 1) * 100:+.1f}% (the callback's own cost)")


if __name__ == "__main__":
    main()
