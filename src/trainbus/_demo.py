"""``trainbus demo``: a small real run whose slow callbacks hide behind training.

It trains an MLP on scikit-learn's handwritten digits (shipped with scikit-learn,
nothing is downloaded) with evaluation after every epoch, and attaches what a real run
would: a progress bar, a JSON-lines metrics file, and an uploader that stands in for a
metrics service by awaiting ``upload_latency_ms`` per request. At the end it reports the
held-out accuracy and how much of the callbacks' time ran while training went on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainbus.core.callback import Callback, blocking
from trainbus.core.destination import LoggerDestination
from trainbus.training.trainer import Trainer

if TYPE_CHECKING:
    from trainbus.callbacks.dashboard import Dashboard
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = [
    "DemoResult",
    "DigitsMLP",
    "SimulatedUploader",
    "exposure",
    "load_digits_loaders",
    "run_demo",
]

_INSTALL = "pip install 'trainbus[demo]'"


class DigitsMLP(torch.nn.Module):
    """An MLP for 8x8 digit images in Composer's style: ``forward(batch)``, ``loss``.

    Example:
        >>> model = DigitsMLP()
        >>> model((torch.zeros(2, 64), torch.tensor([0, 1]))).shape
        torch.Size([2, 10])
    """

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10),
        )

    def forward(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits for the batch's images."""
        result: torch.Tensor = self.net(batch[0])
        return result

    def loss(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """Cross-entropy against the batch's labels."""
        return F.cross_entropy(outputs, batch[1])

    def eval_metrics(
        self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Accuracy on the batch (the trainer averages it over the eval set)."""
        return {"accuracy": (outputs.argmax(dim=1) == batch[1]).float().mean()}


def load_digits_loaders(
    *, seed: int = 0, batch_size: int = 32, test_fraction: float = 0.25
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """Training and held-out loaders over scikit-learn's digits (1,797 8x8 images).

    Raises:
        ImportError: scikit-learn is not installed; the message names the extra.
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise ImportError(
            f"the demo trains on scikit-learn's digits dataset; run `{_INSTALL}`"
        ) from exc
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0,
        digits.target,
        test_size=test_fraction,
        random_state=seed,
        stratify=digits.target,
    )

    def dataset(x: Any, y: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))

    shuffle = torch.Generator().manual_seed(seed)
    train = DataLoader(
        dataset(x_train, y_train), batch_size=batch_size, shuffle=True, generator=shuffle
    )
    test = DataLoader(dataset(x_test, y_test), batch_size=256)
    return train, test


class SimulatedUploader(LoggerDestination):
    """Sends logged points to a pretend metrics service, ``batch_points`` at a time.

    Each request is an ``await anyio.sleep(latency)`` standing in for a network round
    trip. Its methods are coroutines, so they run on the event loop concurrently with
    training and with the other callbacks; ``close`` sends what is left.

    Example:
        >>> uploader = SimulatedUploader(latency=0.02)
        >>> Trainer(model, loader, "1ep", loggers=[uploader]).fit_sync()
        >>> uploader.points_sent, uploader.requests
        (172, 11)
    """

    def __init__(self, latency: float = 0.02, *, batch_points: int = 16) -> None:
        if not latency >= 0:
            raise ValueError(f"latency={latency!r} must be >= 0 seconds, e.g. 0.02")
        if isinstance(batch_points, bool) or not isinstance(batch_points, int) or batch_points < 1:
            raise ValueError(f"batch_points={batch_points!r} must be an int >= 1, e.g. 16")
        self.latency = float(latency)
        self.batch_points = batch_points
        self._buffer: list[tuple[str, float, int]] = []
        self.points_sent = 0
        self.requests = 0
        self.send_time = 0.0

    async def _send(self) -> None:
        points, self._buffer = self._buffer, []
        t0 = time.perf_counter()
        await anyio.sleep(self.latency)  # the network call
        self.send_time += time.perf_counter() - t0
        self.points_sent += len(points)
        self.requests += 1

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Buffer the numeric points; send a request when a batch of them is ready."""
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._buffer.append((name, float(value), step))
        if len(self._buffer) >= self.batch_points:
            await self._send()

    async def close(self, state: State, logger: Logger) -> None:
        """Send the points still buffered."""
        if self._buffer:
            await self._send()


class _TrainingClock(Callback):
    """Notes, on the training thread itself, when training published ``FIT_END``."""

    def __init__(self) -> None:
        self.ended_at = 0.0

    @blocking
    def fit_end(self, state: State, logger: Logger) -> None:
        """Record the time (a blocking handler runs on the training thread, at once)."""
        self.ended_at = time.perf_counter()


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured.

    Attributes:
        accuracy: Accuracy on the held-out split after the last epoch.
        eval_loss: Mean loss on the held-out split.
        callback_time: Seconds spent in callback handlers, all callbacks together.
        waited_time: Seconds the training thread waited for callbacks (at barriers and
            for full queues), from ``engine.statistics()``.
        drain_time: Seconds from the end of training (``FIT_END``) until ``fit()``
            returned: callbacks catching up, then ``close``.
        exposed_time: ``waited_time + drain_time``: callback time training did not hide.
        hidden_time: ``callback_time - exposed_time`` (never below 0): callback work that
            ran while the training thread computed.
        train_time: Seconds ``fit()`` took.
        points_uploaded: Points the simulated uploader sent.
        requests: Requests it made.
        metrics_file: The JSON-lines metrics file.
    """

    accuracy: float
    eval_loss: float
    callback_time: float
    waited_time: float
    drain_time: float
    exposed_time: float
    hidden_time: float
    train_time: float
    points_uploaded: int
    requests: int
    metrics_file: str

    @property
    def hidden_fraction(self) -> float:
        """``hidden_time / callback_time`` (0 when there was no callback work)."""
        return self.hidden_time / self.callback_time if self.callback_time > 0 else 0.0


def exposure(stats: Any, drain_time: float) -> tuple[float, float, float]:
    """``(callback_time, waited_time, hidden_time)`` of a run, as the demo reports them.

    ``stats`` is ``engine.statistics()`` after ``fit()``; ``drain_time`` the seconds from
    ``FIT_END`` until ``fit()`` returned. Hidden time is the handler time the training
    thread did not wait for.
    """
    waited = stats.barrier_wait_time + stats.backpressure_wait_time
    work = stats.handler_time
    return work, waited, max(0.0, work - waited - drain_time)


def _metrics_file_logger(path: Path) -> LoggerDestination:
    from trainbus.loggers.jsonl import JSONLinesLogger

    return JSONLinesLogger(path)


def _progress_bar(stream: TextIO) -> LoggerDestination:
    from trainbus.callbacks.progress_bar import ProgressBar

    return ProgressBar(stream=stream, interval="1ep")


def _monitors() -> list[Callback]:
    """The built-in monitors whose metrics the run logs (those that exist)."""
    found: list[Callback] = []
    try:
        from trainbus.callbacks.speed_monitor import SpeedMonitor

        found.append(SpeedMonitor(window_size=10))
    except ImportError:  # pragma: no cover - a build without it
        pass
    try:
        from trainbus.callbacks.lr_monitor import LRMonitor

        found.append(LRMonitor())
    except ImportError:  # pragma: no cover
        pass
    return found


def _dashboard(dashboard: Dashboard | bool) -> Dashboard | None:
    if dashboard is False:
        return None
    from trainbus.callbacks.dashboard import Dashboard

    if dashboard is True:
        return Dashboard()
    if not isinstance(dashboard, Dashboard):
        raise TypeError(
            f"dashboard={dashboard!r} must be True, False or a trainbus.callbacks.Dashboard"
        )
    return dashboard


def run_demo(
    *,
    epochs: int = 3,
    out: str | Path = "runs/demo",
    upload_latency_ms: float = 20.0,
    seed: int = 0,
    stream: TextIO | None = None,
    dashboard: Dashboard | bool = False,
) -> DemoResult:
    """Train the digits MLP with the demo's callbacks and report what was hidden.

    Args:
        epochs: Epochs to train (evaluation after each).
        out: Folder for ``metrics.jsonl`` and ``summary.json`` (created).
        upload_latency_ms: The simulated uploader's round trip per request.
        seed: Seeds the split, the shuffling and the model's initialisation.
        stream: Where the progress bar and the summary go (default ``sys.stdout``).
        dashboard: ``True``: serve a live dashboard on 127.0.0.1 during the run (its
            address is printed first; it stops when the demo returns). A
            :class:`~trainbus.callbacks.Dashboard`: use that one and leave it serving.

    Example:
        >>> result = run_demo(epochs=1, out="runs/demo")
        >>> round(result.accuracy, 2)
        0.93
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be an int >= 1, e.g. 3")
    if not upload_latency_ms >= 0:
        raise ValueError(f"upload_latency_ms={upload_latency_ms!r} must be >= 0, e.g. 20")
    stream = stream if stream is not None else sys.stdout
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)  # each demo run writes a fresh file

    train_loader, test_loader = load_digits_loaders(seed=seed)
    torch.manual_seed(seed)
    model = DigitsMLP()
    uploader = SimulatedUploader(upload_latency_ms / 1000.0, batch_points=64)
    clock = _TrainingClock()
    board = _dashboard(dashboard)
    trainer = Trainer(
        model,
        train_loader,
        f"{epochs}ep",
        eval_dataloader=test_loader,
        optimizers=torch.optim.AdamW(model.parameters(), lr=2e-3),
        callbacks=[*_monitors(), clock],
        loggers=[
            _progress_bar(stream),
            _metrics_file_logger(metrics_path),
            uploader,
            *([board] if board is not None else []),
        ],
        device="cpu",
        seed=seed,
        run_name="trainbus-demo",
        warn_slow_callbacks=False,  # the uploader is slow on purpose
    )
    if board is not None:
        stream.write(f"dashboard: {board.url}\n")
        stream.flush()
    started = time.perf_counter()
    try:
        trainer.fit_sync()
    finally:
        if board is not None and dashboard is True:
            board.stop()
    returned = time.perf_counter()

    evals = trainer.state.current_metrics["eval"]
    drain = max(0.0, returned - clock.ended_at)
    work, waited, hidden = exposure(trainer.engine.statistics(), drain)
    result = DemoResult(
        accuracy=float(evals["accuracy"]),
        eval_loss=float(evals["loss"]),
        callback_time=work,
        waited_time=waited,
        drain_time=drain,
        exposed_time=waited + drain,
        hidden_time=hidden,
        train_time=returned - started,
        points_uploaded=uploader.points_sent,
        requests=uploader.requests,
        metrics_file=str(metrics_path),
    )
    summary = {**asdict(result), "hidden_fraction": result.hidden_fraction, "epochs": epochs}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _report(result, len(test_loader.dataset), stream)  # type: ignore[arg-type]
    return result


def _report(result: DemoResult, n_test: int, stream: TextIO) -> None:
    lines = [
        f"held-out accuracy: {result.accuracy:.2%} on {n_test} digits "
        f"(loss {result.eval_loss:.3f})",
        f"trained in {result.train_time:.2f} s; uploaded {result.points_uploaded} points in "
        f"{result.requests} requests; metrics in {result.metrics_file}",
        f"{result.callback_time:.2f} s of callback work, {result.hidden_time:.2f} s of it "
        f"hidden behind training ({result.hidden_fraction:.0%})",
        f"  (training waited {result.waited_time:.2f} s at barriers, and "
        f"{result.drain_time:.2f} s after its last batch for callbacks to finish and close)",
    ]
    stream.write("\n".join(lines) + "\n")
    stream.flush()
