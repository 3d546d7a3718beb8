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

The first call of the model and of the loss is also checked, once (afterwards they cost
one attribute test): a model that refuses its input (a dict batch for a model that takes
a tensor), a loss that refuses the model's outputs (a tuple of outputs given to
``cross_entropy``), and a loss that is not one scalar tensor (per-sample losses, a Python
float) fail with a message naming the argument, what it got and what to pass, instead of
torch's error from deep inside the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["BatchCalls", "batch_size_of"]


def batch_size_of(batch: Any) -> int:
    """Samples in ``batch``: the leading dimension of its first tensor (``1`` if none).

    One rule for every loop that counts samples (the Trainer, ``trainbus.Bus``, the
    Lightning bridge): a tensor's leading dimension (``1`` for a 0-d tensor); a tuple, a
    list or another sequence (not a string): its first item's; a mapping: its first value
    that is a tensor, a sequence or a mapping (a string or a number beside the tensors,
    ``{"id": "a", "x": x}``, is skipped); anything else: ``1``.

    Example:
        >>> batch_size_of((torch.zeros(8, 3), torch.zeros(8)))
        8
        >>> batch_size_of({"name": "a", "x": torch.zeros(4, 2)})
        4
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, tuple | list):  # the common case, before the ABC checks
        return batch_size_of(batch[0]) if batch else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, torch.Tensor | Mapping) or _is_sequence(value):
                return batch_size_of(value)
        return 1
    if _is_sequence(batch) and batch:
        return batch_size_of(batch[0])
    return 1


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _describe(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a bare Tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, tuple | list):
        return f"a {type(batch).__name__} of {len(batch)} items"
    return f"a {type(batch).__qualname__}"


def _describe_value(value: Any) -> str:
    """What a value is, for an error message: its type and, for containers, a glimpse."""
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    if isinstance(value, Mapping):
        keys = ", ".join(repr(k) for k in list(value)[:6])
        return f"a {type(value).__name__} with keys {keys}"
    if isinstance(value, tuple | list):
        inner = ", ".join(type(v).__name__ for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"a {type(value).__name__} of {len(value)} ({inner})"
    if isinstance(value, int | float):
        return f"a {type(value).__qualname__} ({value!r})"
    return f"a {type(value).__qualname__}"


#: Losses that compare outputs and targets element by element: targets of another shape
#: are broadcast (torch warns, then fails or silently computes the wrong loss).
_ELEMENTWISE = tuple(
    getattr(torch.nn.functional, name)
    for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
)
_ELEMENTWISE_MODULES = (
    torch.nn.MSELoss, torch.nn.L1Loss, torch.nn.SmoothL1Loss, torch.nn.HuberLoss,
)  # fmt: skip


def _class_indices_for(outputs: Any, targets: Any) -> bool:
    """Whether ``targets`` look like class indices for ``outputs`` (logits)."""
    return (
        isinstance(outputs, torch.Tensor)
        and isinstance(targets, torch.Tensor)
        and not targets.is_floating_point()
        and outputs.dim() == targets.dim() + 1
    )


def _check_regression_shapes(loss_fn: Any, outputs: Any, targets: Any) -> None:
    """An element-wise loss (``mse_loss``, ...) given targets of another shape: the fix,
    before torch's broadcast warning and shape error."""
    if not (loss_fn in _ELEMENTWISE or isinstance(loss_fn, _ELEMENTWISE_MODULES)):
        return
    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return
    if outputs.shape == targets.shape:
        return
    name = getattr(loss_fn, "__name__", type(loss_fn).__qualname__)
    said = (
        f"loss_fn={name} compares outputs and targets element by element, but the model's "
        f"outputs have shape {tuple(outputs.shape)} and the targets shape "
        f"{tuple(targets.shape)} ({targets.dtype})"
    )
    if _class_indices_for(outputs, targets):
        raise ValueError(
            f"{said}: the targets look like class indices. Use a classification loss, "
            "e.g. loss_fn=F.cross_entropy, or one-hot float targets "
            "(F.one_hot(y, num_classes).float())"
        )
    raise ValueError(
        f"{said}: they must have the same shape (torch would broadcast them and compute "
        "the wrong loss); e.g. return outputs.squeeze(-1) from forward, or reshape the "
        "targets in the dataset"
    )


class BatchCalls:
    """Calls the model and the loss on a batch by the trainer's convention.

    Args:
        model: The model; if it has a callable ``loss``, that is the loss.
        loss_fn: The loss for a model without ``loss``.
        module: What :meth:`forward` calls, when not ``model`` itself (the
            ``DistributedDataParallel`` wrapper of ``model`` under ``torchrun``).
    """

    __slots__ = ("checked_forward", "checked_loss", "loss_fn", "model", "model_loss")

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
        self.checked_forward = False  # the first call of each is checked (module docstring)
        self.checked_loss = False

    @property
    def loss_name(self) -> str:
        """How the loss is called, for messages: ``model.loss`` or ``loss_fn``."""
        return "model.loss" if self.model_loss is not None else "loss_fn"

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
        if not self.checked_forward:
            return self._first_forward(batch)
        if self.model_loss is not None or isinstance(batch, Mapping):
            return self.model(batch)
        return self.model(batch[0])

    def loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        """``model.loss(outputs, batch)``, ``loss_fn(outputs, targets)`` or ``(outputs, batch)``."""
        if not self.checked_loss:
            return self._first_loss(outputs, batch)
        if self.model_loss is not None:
            return self.model_loss(outputs, batch)
        assert self.loss_fn is not None
        if isinstance(batch, Mapping):
            return self.loss_fn(outputs, batch)
        return self.loss_fn(outputs, batch[1])

    # -- the first call of each, checked -------------------------------------------------

    def _first_forward(self, batch: Any) -> Any:
        whole = self.model_loss is not None or isinstance(batch, Mapping)
        given = batch if whole else batch[0]
        try:
            outputs = self.model(given)
        except TypeError as exc:
            if not isinstance(given, Mapping):
                raise
            hint = (
                "make forward take the dict, e.g. def forward(self, batch): return "
                "self.net(batch['x'])"
            )
            if self.model_loss is None:
                hint += (
                    ", or have the loader yield (inputs, targets) pairs: model(inputs), "
                    "loss_fn(outputs, targets)"
                )
            raise TypeError(
                f"model(batch) got {_describe_value(given)} (trainbus passes a dict batch "
                f"whole to the model), and the model refused it: {exc}; {hint}"
            ) from exc
        self.checked_forward = True
        return outputs

    def _first_loss(self, outputs: Any, batch: Any) -> torch.Tensor:
        name = self.loss_name
        call: Callable[[Any, Any], torch.Tensor]
        if self.model_loss is not None:
            call, args, second = self.model_loss, "model.loss(outputs, batch)", batch
        else:
            assert self.loss_fn is not None
            call = self.loss_fn
            if isinstance(batch, Mapping):
                args, second = "loss_fn(outputs, batch)", batch
            else:
                args, second = "loss_fn(outputs, targets)", batch[1]
        if call is self.loss_fn:
            _check_regression_shapes(call, outputs, second)
        try:
            loss: Any = call(outputs, second)
        except RuntimeError as exc:
            if not _class_indices_for(outputs, second):
                raise
            raise ValueError(
                f"{args} failed: {exc}. The targets look like class indices "
                f"({_describe_value(second)}, {second.dtype}) for outputs of shape "
                f"{tuple(outputs.shape)}: use a classification loss, e.g. "
                "loss_fn=F.cross_entropy, or give targets of the outputs' shape (e.g. "
                "F.one_hot(y, num_classes).float())"
            ) from exc
        except TypeError as exc:
            if not isinstance(outputs, tuple | list | Mapping):
                raise
            raise TypeError(
                f"{args} got outputs = {_describe_value(outputs)} from the model, and "
                f"{name} refused them: {exc}; return one tensor from forward, or pick it in "
                f"the loss, e.g. loss_fn=lambda outputs, y: F.cross_entropy(outputs[0], y)"
            ) from exc
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"{name} returned {_describe_value(loss)}, but the loss must be a scalar "
                "torch.Tensor that backward() can reach the weights from: return the tensor "
                "itself, without .item(), float(...) or torch.tensor(...) around it"
            )
        if loss.numel() != 1:
            raise ValueError(
                f"{name} returned a Tensor of shape {tuple(loss.shape)} (one loss per sample?), "
                "but the loss must be a scalar: reduce it, e.g. return losses.mean(), or "
                "F.cross_entropy(outputs, y) with its default reduction='mean' instead of "
                "reduction='none'"
            )
        if torch.is_grad_enabled() and not loss.requires_grad and any(
            p.requires_grad for p in self.model.parameters()
        ):
            raise ValueError(
                f"{name} returned a Tensor that does not require grad: it was computed from "
                "detached values (.detach(), .item(), .numpy(), torch.tensor(...)), so "
                "backward() cannot reach the model's weights; compute it from the outputs "
                f"with torch operations ({args}, second argument: {_describe_value(second)})"
            )
        self.checked_loss = True
        return loss
