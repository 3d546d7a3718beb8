"""The default job: a small MLP learning a synthetic classification task on the CPU.

Batches are generated on the fly from a seed, so a job of a million batches costs no
more memory than a job of ten.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from trainbus.serve._jobs import JobContext
from trainbus.training.trainer import Trainer

__all__ = ["DEMO_DEFAULTS", "DemoMLP", "SyntheticBatches", "demo_job_factory"]

#: Parameters a client may send to the default job, with their defaults and bounds.
DEMO_DEFAULTS: dict[str, tuple[type, int | float, int | float, int | float]] = {
    # name: (type, default, min, max)
    "epochs": (int, 2, 1, 10_000),
    "batches": (int, 20, 1, 10_000_000),
    "batch_size": (int, 32, 1, 4096),
    "hidden": (int, 64, 1, 4096),
    "eval_batches": (int, 4, 0, 10_000),
    "lr": (float, 1e-2, 0.0, 10.0),
    "seed": (int, 0, 0, 2**31 - 1),
}

_FEATURES = 16
_CLASSES = 4


def _parse(params: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - set(DEMO_DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown}; the demo job takes {sorted(DEMO_DEFAULTS)}"
        )
    out: dict[str, Any] = {}
    for name, (kind, default, low, high) in DEMO_DEFAULTS.items():
        value = params.get(name, default)
        ok_type = (
            isinstance(value, int | float) if kind is float else isinstance(value, int)
        ) and not isinstance(value, bool)
        if not ok_type or not low <= value <= high:
            raise ValueError(
                f"{name}={value!r} must be {'a number' if kind is float else 'an int'} "
                f"between {low} and {high}, e.g. {default}"
            )
        out[name] = kind(value)
    return out


class SyntheticBatches:
    """``(inputs, labels)`` batches of a fixed random teacher, generated per epoch.

    Args:
        batches: Batches per epoch.
        batch_size: Samples per batch.
        seed: Seeds the teacher (the task).
        split: Seeds the inputs: different splits see different samples of one task
            (each epoch of a split sees the same ones).
    """

    def __init__(self, batches: int, batch_size: int, seed: int, split: int = 0) -> None:
        self.batches = batches
        self.batch_size = batch_size
        self.data_seed = (seed + 1) * 1000 + split
        gen = torch.Generator().manual_seed(seed)
        self.teacher = torch.randn(_FEATURES, _CLASSES, generator=gen)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.data_seed)
        for _ in range(self.batches):
            x = torch.randn(self.batch_size, _FEATURES, generator=gen)
            yield x, (x @ self.teacher).argmax(dim=1)


class DemoMLP(torch.nn.Module):
    """16 -> hidden -> 4, ReLU; reports accuracy at evaluation."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(_FEATURES, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, _CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def eval_metrics(self, outputs: torch.Tensor, batch: Any) -> dict[str, torch.Tensor]:
        """Accuracy of ``outputs`` on ``batch``'s labels."""
        return {"accuracy": (outputs.argmax(dim=1) == batch[1]).float().mean()}


def demo_job_factory(ctx: JobContext) -> Trainer:
    """Build the default job: :class:`DemoMLP` on :class:`SyntheticBatches`.

    Parameters (all optional, see :data:`DEMO_DEFAULTS`): ``epochs``, ``batches`` (per
    epoch), ``batch_size``, ``hidden``, ``eval_batches`` (0: no evaluation), ``lr``,
    ``seed``.

    Raises:
        ValueError: An unknown parameter or a value out of range (the service answers
            400 with this message).

    Example:
        >>> app = create_app(demo_job_factory)
        >>> # POST /jobs {"epochs": 2, "batches": 20}
    """
    p = _parse(ctx.params)
    torch.manual_seed(p["seed"])
    model = DemoMLP(p["hidden"])
    train = SyntheticBatches(p["batches"], p["batch_size"], p["seed"])
    evaluate = (
        SyntheticBatches(p["eval_batches"], p["batch_size"], p["seed"], split=1)
        if p["eval_batches"]
        else None
    )
    return Trainer(
        model,
        train,
        f"{p['epochs']}ep",
        eval_dataloader=evaluate,
        optimizers=torch.optim.SGD(model.parameters(), lr=p["lr"]),
        loss_fn=torch.nn.functional.cross_entropy,
        loggers=ctx.loggers,
        device="cpu",
        run_name=f"job-{ctx.job_id}",
    )
