"""``state.evaluators``: Composer v0.6's view of the evaluation data, one per evaluator.

trainbus evaluates one data loader (``Trainer(eval_dataloader=...)``); Composer v0.6's
callbacks and loggers read it as ``state.evaluators``, a list of evaluators with a
``label`` and a ``dataloader`` (a data spec whose ``dataloader`` is the loader itself).
``ProgressBarLogger`` sizes its evaluation bar from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DataSpec", "Evaluator", "evaluators_of"]

#: The label of the trainer's one evaluator (Composer's, for ``Trainer(eval_dataloader=)``).
EVAL_LABEL = "eval"


@dataclass(frozen=True, slots=True)
class DataSpec:
    """A data loader as Composer v0.6's ``DataSpec`` wraps it.

    Attributes:
        dataloader: The data loader itself.
    """

    dataloader: Any


@dataclass(frozen=True, slots=True)
class Evaluator:
    """One evaluation data set, as Composer v0.6's ``Evaluator`` names it.

    Attributes:
        label: Its name in logged metrics and progress bars (``"eval"``).
        dataloader: Its :class:`DataSpec` (``evaluator.dataloader.dataloader`` is the loader).

    Example:
        >>> [(e.label, len(e.dataloader.dataloader)) for e in state.evaluators]
        [('eval', 4)]
    """

    label: str
    dataloader: DataSpec


def evaluators_of(eval_dataloader: Any) -> list[Evaluator]:
    """The evaluators of a run with ``eval_dataloader`` (none without one)."""
    if eval_dataloader is None:
        return []
    return [Evaluator(EVAL_LABEL, DataSpec(eval_dataloader))]
