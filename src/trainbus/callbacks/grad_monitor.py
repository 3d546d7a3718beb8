"""``GradMonitor``: the L2 norm of the gradients the optimizer is about to apply.

As in Composer v0.6, the norms are read at ``AFTER_TRAIN_BATCH``: after the last
backward of the batch, with the gradients unscaled (fp16) and clipped
(``grad_clip_norm``), before the optimizer step. The training thread does not wait for
ordinary handlers, and the next batch zeroes the gradients, so the norm is computed in a
plain ``@blocking`` handler: it runs on the training thread, in lockstep, before the
step. The norms stay tensors (``torch._foreach_norm``, one fused launch on CUDA) and are
handed to the logger as they are, which copies them to the host without a
synchronisation; nothing here calls ``.item()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainbus.core.callback import Callback, blocking

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["GradMonitor"]


def _norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each gradient, as 0-d tensors on the gradients' devices."""
    if all(not g.is_sparse for g in grads):
        try:
            return list(torch._foreach_norm(grads, 2))
        except (RuntimeError, TypeError):  # exotic mixes of devices or layouts
            pass
    return [torch.linalg.vector_norm(g.coalesce().values() if g.is_sparse else g, 2) for g in grads]


def _total(norms: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients together, from the per-tensor norms."""
    device = norms[0].device
    if any(n.device != device for n in norms):
        norms = [n.to(device) for n in norms]
    stacked = torch.stack(norms)
    if stacked.dtype != torch.float32:
        stacked = stacked.float()
    total: torch.Tensor = torch.linalg.vector_norm(stacked, 2)
    return total


class GradMonitor(Callback):
    """Logs the L2 norm of the model's gradients after every batch.

    Logs ``grad_l2_norm/step`` (the norm of all gradients together) and, with
    ``log_layer_grad_norms=True``, ``layer_grad_l2_norm/<parameter name>`` for each
    parameter that has a gradient. Values are logged at ``BATCH_END``, one per batch,
    with that batch's step. The norms are those of the gradients the optimizer applies:
    accumulated over the microbatches, unscaled (fp16) and clipped (``grad_clip_norm``).

    The norms are computed at ``AFTER_TRAIN_BATCH`` (where Composer v0.6's
    ``GradMonitor`` reads them) by a plain ``@blocking`` handler, on the training thread
    before the optimizer step: a fused norm of every gradient, a stack and one more
    norm, all device-side. The values reach loggers through
    non-blocking copies, so the monitor never synchronises with the GPU.

    Args:
        log_layer_grad_norms: Also log the norm of each parameter's gradient.

    Example:
        >>> from trainbus.callbacks import GradMonitor
        >>> logs = InMemoryLogger()
        >>> Trainer(model, loader, "1ep", callbacks=[GradMonitor(log_layer_grad_norms=True)],
        ...         loggers=[logs]).fit_sync()
        >>> sorted(logs.most_recent_values)
        ['grad_l2_norm/step', 'layer_grad_l2_norm/lin.bias', 'layer_grad_l2_norm/lin.weight', ...]
    """

    def __init__(self, log_layer_grad_norms: bool = False) -> None:
        self.log_layer_grad_norms = bool(log_layer_grad_norms)
        self._pending: dict[str, torch.Tensor] | None = None

    @blocking
    def after_train_batch(self, state: State, logger: Logger) -> None:
        """Compute the norms (device-side) of the complete gradients, before the step."""
        names: list[str] = []
        grads: list[torch.Tensor] = []
        for name, param in state.model.named_parameters():
            if param.grad is not None:
                names.append(name)
                grads.append(param.grad.detach())
        if not grads:
            self._pending = None
            return
        norms = _norms(grads)
        metrics = {"grad_l2_norm/step": _total(norms)}
        if self.log_layer_grad_norms:
            for name, norm in zip(names, norms, strict=True):
                metrics[f"layer_grad_l2_norm/{name}"] = norm
        self._pending = metrics

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        """Log the norms of the batch's (accumulated) gradients."""
        metrics: dict[str, Any] | None = self._pending
        self._pending = None
        if metrics is not None:
            logger.log_metrics(metrics)
