"""What the stopping callbacks share: reading a monitored metric and comparing values."""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainbus.core.callback import Callback, blocking
from trainbus.core.scalars import DeferredScalar

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = [
    "Comparison",
    "MetricCheck",
    "default_comparison",
    "read_metric",
    "resolve_comparison",
    "to_float",
]

Comparison = Callable[[float, float], Any]

_LOWER_IS_BETTER = ("loss", "error", "perplexity")
_NAMED: dict[str, Comparison] = {
    "lt": operator.lt,
    "less": operator.lt,
    "<": operator.lt,
    "gt": operator.gt,
    "greater": operator.gt,
    ">": operator.gt,
}


def default_comparison(monitor: str) -> Comparison:
    """``<`` for names containing loss, error or perplexity; ``>`` otherwise."""
    lowered = monitor.lower()
    return operator.lt if any(s in lowered for s in _LOWER_IS_BETTER) else operator.gt


def resolve_comparison(comp: str | Comparison | None, monitor: str, owner: str) -> Comparison:
    """The comparison for ``comp``: a callable, ``'lt'``/``'gt'`` (and synonyms) or None."""
    if comp is None:
        return default_comparison(monitor)
    if isinstance(comp, str):
        try:
            return _NAMED[comp.strip().lower()]
        except KeyError:
            raise ValueError(
                f"{owner}(comp={comp!r}) is not a known comparison; use 'lt' (lower is "
                "better), 'gt' (higher is better) or a callable comp(current, reference)"
            ) from None
    if not callable(comp):
        raise TypeError(f"{owner}(comp=...) must be a callable, 'lt', 'gt' or None, got {comp!r}")
    return comp


def to_float(value: Any) -> float:
    """A metric value as a float: 0-d tensors, deferred GPU scalars and numbers.

    A CUDA tensor the trainer tagged for a host copy is read from that copy (waiting
    for it if it has not landed yet); the monitored value is what the user asked for.
    """
    if isinstance(value, DeferredScalar):
        return value.get()
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"the monitored metric is a tensor of shape {tuple(value.shape)}; "
                "monitor a scalar (a 0-d tensor or a float)"
            )
        return DeferredScalar.of(value).get()
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"the monitored metric is a {type(value).__qualname__}, not a number; "
        "monitor a scalar (a 0-d tensor or a float)"
    )


def read_metric(state: State, label: str, monitor: str, owner: str) -> float:
    """``state.current_metrics[label][monitor]``; for ``("train", "loss")`` ``state.loss``.

    Raises:
        ValueError: The metric is not there; the message lists what is.
    """
    metrics = state.current_metrics.get(label)
    if metrics is not None and monitor in metrics:
        return to_float(metrics[monitor])
    if label == "train" and monitor == "loss" and state.loss is not None:
        return to_float(state.loss)
    available = {k: sorted(v) for k, v in state.current_metrics.items()}
    raise ValueError(
        f"{owner}(monitor={monitor!r}, dataloader_label={label!r}) found no such metric; "
        f"state.current_metrics has {available}. Use dataloader_label='eval' with one of "
        "the eval metrics, or monitor='loss' with dataloader_label='train'"
    )


class MetricCheck(Callback):
    """Base of the stoppers: ``_check`` in lockstep at ``EVAL_END`` (eval metrics) or at
    ``BATCH_END`` (``dataloader_label="train"``), so a stop lands at the right batch."""

    dataloader_label: str

    def _check(self, state: State) -> None:
        raise NotImplementedError

    @blocking
    def eval_end(self, state: State, logger: Logger) -> None:
        """Check an evaluation metric."""
        if self.dataloader_label != "train":
            self._check(state)

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        """Check a training metric."""
        if self.dataloader_label == "train":
            self._check(state)
