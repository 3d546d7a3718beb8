"""``ThresholdStopper``: stop training when a metric reaches a threshold."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainbus.callbacks._monitor import Comparison, MetricCheck, read_metric, resolve_comparison

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = ["ThresholdStopper"]


class ThresholdStopper(MetricCheck):
    """Stops training as soon as ``comp(monitor, threshold)`` holds.

    The metric is read from ``state.current_metrics[dataloader_label][monitor]`` at
    every ``EVAL_END``, or, for ``dataloader_label="train"``, at every ``BATCH_END``
    (``monitor="loss"`` then reads ``state.loss``, the loss of the batch's last
    microbatch). By default a metric whose name contains loss, error or perplexity
    must fall below the threshold; any other must rise above it.

    The handlers are plain ``@blocking`` methods, so training ends right after the
    evaluation (or batch) that reached the threshold.

    Args:
        monitor: The metric's name, e.g. ``"accuracy"``.
        dataloader_label: ``"eval"`` (the trainer's evaluation) or ``"train"``.
        threshold: The value to reach.
        comp: ``comp(current, threshold) -> bool`` on floats, or ``"lt"``/``"gt"``.

    Example:
        >>> from trainbus.callbacks import ThresholdStopper
        >>> trainer = Trainer(model, loader, "100ep", eval_dataloader=val_loader,
        ...                   callbacks=[ThresholdStopper("accuracy", threshold=0.95)])
        >>> trainer.fit_sync()      # ends after the first evaluation with accuracy > 0.95
    """

    def __init__(
        self,
        monitor: str,
        *,
        dataloader_label: str = "eval",
        threshold: float,
        comp: str | Comparison | None = None,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(
                f"ThresholdStopper(monitor={monitor!r}) must be a metric name, e.g. 'accuracy'"
            )
        if not isinstance(dataloader_label, str) or not dataloader_label:
            raise TypeError(
                f"ThresholdStopper(dataloader_label={dataloader_label!r}) must be 'eval' or 'train'"
            )
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"ThresholdStopper(threshold={threshold!r}) must be a number")
        if math.isnan(threshold):
            raise ValueError("ThresholdStopper(threshold=nan) can never be reached; use a number")
        self.monitor = monitor
        self.dataloader_label = dataloader_label
        self.threshold = float(threshold)
        self.comp = resolve_comparison(comp, monitor, "ThresholdStopper")

    def _check(self, state: State) -> None:
        value = read_metric(state, self.dataloader_label, self.monitor, "ThresholdStopper")
        if self.comp(value, self.threshold):
            state.stop_training()
