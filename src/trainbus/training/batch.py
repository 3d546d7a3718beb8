"""How a batch reaches the model and the loss, and the check of its format.

Three conventions, decided once per trainer (``docs/training-loop.md``, "Batches"):

- the model defines ``loss(outputs, batch)`` (Composer's convention): ``model(batch)`` and
  ``model.loss(outputs, batch)``, whatever the batch is (a tensor, a tuple, a dict, ...);
- otherwise, with ``loss_fn``, an ``(inputs, targets)`` pair (a tuple or a list of two):
  ``model(inputs)`` and ``loss_fn(outputs, targets)``;
- otherwise, with ``loss_fn``, a dict (Hugging Face style): ``model(batch)`` and
  ``loss_fn(outputs, batch)``.

Anything else fails at the batch that breaks the rule, before any event of that batch,
with a message that says what a batch must be.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["BatchCalls"]


def _describe(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a bare Tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, tuple | list):
        return f"a {type(batch).__name__} of {len(batch)} items"
    return f"a {type(batch).__qualname__}"


class BatchCalls:
    """Calls the model and the loss on a batch by the trainer's convention.

    Args:
        model: The model; if it has a callable ``loss``, that is the loss.
        loss_fn: The loss for a model without ``loss``.
        module: What :meth:`forward` calls, when not ``model`` itself (the
            ``DistributedDataParallel`` wrapper of ``model`` under ``torchrun``).
    """

    __slots__ = ("loss_fn", "model", "model_loss")

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
        module: torch.nn.Module | None = None,
    ) -> None:
        self.model = model if module is None else module
        model_loss = getattr(model, "loss", None)
        self.model_loss: Callable[[Any, Any], torch.Tensor] | None = (
            model_loss if callable(model_loss) else None
        )
        self.loss_fn = loss_fn

    def check(self, batch: Any, where: str) -> None:
        """Raise ``TypeError`` if ``batch`` (from the loader named ``where``) fits no rule."""
        if self.model_loss is not None or isinstance(batch, Mapping):
            return
        if isinstance(batch, tuple | list) and len(batch) == 2:
            return
        raise TypeError(
            f"{where} produced {_describe(batch)}, but with loss_fn (and no model.loss) a batch "
            "must be an (inputs, targets) pair, a tuple or list of two: model(inputs), "
            "loss_fn(outputs, targets); or a dict: model(batch), loss_fn(outputs, batch). "
            "For any other batch (a bare tensor, more items), define "
            "model.loss(outputs, batch) (Composer's convention): forward then gets the "
            "whole batch"
        )

    def forward(self, batch: Any) -> Any:
        """The model's outputs: on the whole batch, or on the inputs of a pair."""
        if self.model_loss is not None or isinstance(batch, Mapping):
            return self.model(batch)
        return self.model(batch[0])

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        """``model.loss(outputs, batch)``, ``loss_fn(outputs, targets)`` or ``(outputs, batch)``."""
        if self.model_loss is not None:
            return self.model_loss(outputs, batch)
        assert self.loss_fn is not None
        if isinstance(batch, Mapping):
            return self.loss_fn(outputs, batch)
        return self.loss_fn(outputs, batch[1])
