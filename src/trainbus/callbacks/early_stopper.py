"""``EarlyStopper``: stop training when a metric has stopped improving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainbus.callbacks._monitor import Comparison, MetricCheck, read_metric, resolve_comparison
from trainbus.core.time import Time, TimeUnit, ensure_time
from trainbus.core.timer import Timestamp

if TYPE_CHECKING:
    from trainbus.core.state import State

__all__ = ["EarlyStopper"]


class EarlyStopper(MetricCheck):
    """Stops training when ``monitor`` has not improved for longer than ``patience``.

    The metric is read from ``state.current_metrics[dataloader_label][monitor]`` (a
    0-d tensor or a float) at every ``EVAL_END``, or, for ``dataloader_label="train"``,
    at every ``BATCH_END``; ``monitor="loss"`` with ``"train"`` reads ``state.loss`` (the
    loss of the batch's last microbatch) when no train metrics are recorded.

    As in Composer, the first value is the best so far; a later value is an improvement
    when ``comp(value, best)`` holds and it differs from the best by more than
    ``min_delta``. Training stops (``state.stop_training()``) once the time since the
    best exceeds ``patience``: with ``"1ep"`` at the second epoch without improvement,
    with ``"10ba"`` at the 11th batch; an ``int`` patience counts evaluations (checks),
    so ``patience=2`` stops at the third check in a row without improvement.

    The handlers are plain ``@blocking`` methods: the decision is taken on the training
    thread before it goes on, so training ends right after the evaluation (or batch)
    that triggered it, whatever ``barriers``/``max_lag`` the trainer uses. Its state
    (best value and when) is saved in checkpoints.

    Args:
        monitor: The metric's name, e.g. ``"loss"`` or ``"accuracy"``.
        dataloader_label: ``"eval"`` (the trainer's evaluation) or ``"train"``.
        comp: ``comp(current, best) -> bool`` on floats, or ``"lt"``/``"gt"``. Default:
            lower is better for names containing loss, error or perplexity, else higher.
        min_delta: How much a value must beat the best by to count (>= 0).
        patience: A :class:`~trainbus.Time` or string in epochs or batches (``"1ep"``,
            ``"10ba"``), or an int number of evaluations.

    Example:
        >>> from trainbus.callbacks import EarlyStopper
        >>> stopper = EarlyStopper("loss", patience="2ep", min_delta=1e-3)
        >>> trainer = Trainer(model, loader, "100ep", eval_dataloader=val_loader,
        ...                   callbacks=[stopper])
        >>> trainer.fit_sync()      # ends 3 epochs after the eval loss last improved
    """

    def __init__(
        self,
        monitor: str,
        *,
        dataloader_label: str = "eval",
        comp: str | Comparison | None = None,
        min_delta: float = 0.0,
        patience: Time[Any] | str | int = "1ep",
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"EarlyStopper(monitor={monitor!r}) must be a metric name, e.g. 'loss'")
        if not isinstance(dataloader_label, str) or not dataloader_label:
            raise TypeError(
                f"EarlyStopper(dataloader_label={dataloader_label!r}) must be 'eval' or 'train'"
            )
        self.monitor = monitor
        self.dataloader_label = dataloader_label
        self.comp = resolve_comparison(comp, monitor, "EarlyStopper")
        self.min_delta = abs(float(min_delta))
        self.patience: Time[int] | int
        if isinstance(patience, int) and not isinstance(patience, bool):
            if patience < 0:
                raise ValueError(
                    f"EarlyStopper(patience={patience}) must be >= 0 evaluations, or a time "
                    "such as '1ep' or '10ba'"
                )
            self.patience = patience
        else:
            time = ensure_time(patience, name="EarlyStopper(patience=...)")
            if time.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH):
                raise ValueError(
                    f"EarlyStopper(patience={patience!r}) must be in epochs or batches, "
                    "e.g. '1ep' or '10ba', or an int number of evaluations"
                )
            self.patience = time
        self.best: float | None = None
        self.best_timestamp: Timestamp | None = None
        self.checks_since_best = 0

    def _check(self, state: State) -> None:
        value = read_metric(state, self.dataloader_label, self.monitor, "EarlyStopper")
        ts = state.timestamp
        best = self.best
        if best is None or (self.comp(value, best) and abs(value - best) > self.min_delta):
            self.best = value
            self.best_timestamp = ts
            self.checks_since_best = 0
            return
        self.checks_since_best += 1
        patience = self.patience
        if isinstance(patience, int):
            waited: int = self.checks_since_best
        else:
            assert self.best_timestamp is not None
            since = self.best_timestamp.get(patience.unit)
            waited = int(ts.get(patience.unit).value) - int(since.value)
            patience = int(patience.value)
        if waited > patience:
            state.stop_training()

    def state_dict(self) -> dict[str, Any]:
        """The best value, when it occurred, and the checks since."""
        return {
            "best": self.best,
            "best_timestamp": (
                None if self.best_timestamp is None else self.best_timestamp.state_dict()
            ),
            "checks_since_best": self.checks_since_best,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.best = state.get("best")
        ts = state.get("best_timestamp")
        self.best_timestamp = None if ts is None else Timestamp(**ts)
        self.checks_since_best = int(state.get("checks_since_best", 0))
