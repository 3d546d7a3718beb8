"""``LRMonitor``: the learning rate of every optimizer parameter group, every batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainbus.core.callback import Callback, blocking

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["LRMonitor"]


class LRMonitor(Callback):
    """Logs ``lr-<OptimizerClass>/group<i>`` for each parameter group at ``BATCH_END``.

    The value is the learning rate the group holds at the end of the batch, after the
    schedulers stepped (the rate the next batch will use), as in Composer. When two
    optimizers share a class, the second is logged as ``lr-<OptimizerClass>-1/...``.

    Optimizers are live objects, so the handler is ``@blocking`` and plain: it reads
    them on the training thread at the event itself (a few microseconds), which keeps
    the value exact even with ``Trainer(max_lag=...)`` or without barriers. Rates held
    in tensors are logged without a host-device synchronisation.

    Example:
        >>> from trainbus.callbacks import LRMonitor
        >>> logs = InMemoryLogger()
        >>> Trainer(model, loader, "1ep", optimizers=torch.optim.SGD(params, lr=0.1),
        ...         callbacks=[LRMonitor()], loggers=[logs]).fit_sync()
        >>> logs.most_recent_values["lr-SGD/group0"]
        0.1
    """

    @blocking
    def batch_end(self, state: State, logger: Logger) -> None:
        """Log the learning rate of each parameter group of each optimizer."""
        metrics: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for optimizer in state.optimizers:
            name = type(optimizer).__name__
            count = seen.get(name, 0)
            seen[name] = count + 1
            prefix = f"lr-{name}" if count == 0 else f"lr-{name}-{count}"
            for i, group in enumerate(optimizer.param_groups):
                metrics[f"{prefix}/group{i}"] = group["lr"]
        if metrics:
            logger.log_metrics(metrics)
