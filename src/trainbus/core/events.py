"""Training events: Composer's names and values, in the order the trainer fires them."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Event"]


class Event(StrEnum):
    """An event of the training loop.

    Each value is the name of the :class:`~trainbus.Callback` method that handles it,
    so ``getattr(callback, event.value)`` is the handler. Members and values are those
    of MosaicML Composer v0.6, plus ``FIT_END``.

    The trainer publishes them in this order (``docs/training-loop.md`` has the long
    version, with what ``p.grad`` holds at each event)::

        INIT                                  # in Trainer(...), or when fit() starts
        FIT_START
        for each epoch:
            EPOCH_START
            for each batch:
                AFTER_DATALOADER
                BATCH_START
                BEFORE_TRAIN_BATCH
                optimizer.zero_grad()
                for each microbatch (grad_accum of them):
                    BEFORE_FORWARD
                    outputs = model(...)
                    AFTER_FORWARD
                    BEFORE_LOSS
                    loss = model.loss(...) or loss_fn(...)
                    AFTER_LOSS
                    BEFORE_BACKWARD
                    (scaled) loss.backward()
                    AFTER_BACKWARD
                unscale the gradients (fp16), clip them (grad_clip_norm)
                AFTER_TRAIN_BATCH             # gradients complete, not yet applied
                optimizer.step(), scheduler.step()
                timer.batch += 1
                BATCH_END                     # a barrier by default
                (evaluation, when eval_interval is in batches)
                BATCH_CHECKPOINT              # after any batch-wise evaluation
            timer.epoch += 1
            EPOCH_END
            (evaluation, when eval_interval is in epochs):
                EVAL_START
                for each eval batch:
                    EVAL_BATCH_START
                    EVAL_BEFORE_FORWARD
                    outputs = model(...)
                    EVAL_AFTER_FORWARD
                    EVAL_BATCH_END
                EVAL_END
            EPOCH_CHECKPOINT
        FIT_END
        close(), then post_close(), on every callback

    Example:
        >>> Event("batch_end") is Event.BATCH_END
        True
        >>> Event.BEFORE_FORWARD.canonical_name
        'forward'
    """

    INIT = "init"
    FIT_START = "fit_start"

    EPOCH_START = "epoch_start"
    BATCH_START = "batch_start"

    AFTER_DATALOADER = "after_dataloader"
    BEFORE_TRAIN_BATCH = "before_train_batch"

    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"

    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"

    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"

    AFTER_TRAIN_BATCH = "after_train_batch"

    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"

    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"

    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"

    FIT_END = "fit_end"

    @property
    def canonical_name(self) -> str:
        """The name without its ``before_``/``after_``/``_start``/``_end`` affixes.

        ``BEFORE_FORWARD`` and ``AFTER_FORWARD`` are both ``"forward"``; ``EVAL_START`` is
        ``"eval"``. Events that form a pair share a canonical name.
        """
        name: str = self.value
        for affix in ("before_", "after_"):
            name = name.replace(affix, "")
        for affix in ("_start", "_end"):
            name = name.replace(affix, "")
        return name

    @property
    def is_before_event(self) -> bool:
        """Whether this event opens a pair (``*_START``, ``BEFORE_*``)."""
        return self in _BEFORE_EVENTS

    @property
    def is_after_event(self) -> bool:
        """Whether this event closes a pair (``*_END``, ``AFTER_*``)."""
        return self in _AFTER_EVENTS

    @property
    def is_eval(self) -> bool:
        """Whether this event belongs to an evaluation pass."""
        return self.value.startswith("eval_")


_BEFORE_EVENTS = frozenset(
    {
        Event.FIT_START,
        Event.EPOCH_START,
        Event.BATCH_START,
        Event.BEFORE_TRAIN_BATCH,
        Event.BEFORE_FORWARD,
        Event.BEFORE_LOSS,
        Event.BEFORE_BACKWARD,
        Event.EVAL_START,
        Event.EVAL_BATCH_START,
        Event.EVAL_BEFORE_FORWARD,
    }
)
_AFTER_EVENTS = frozenset(
    {
        Event.FIT_END,
        Event.EPOCH_END,
        Event.BATCH_END,
        Event.AFTER_TRAIN_BATCH,
        Event.AFTER_FORWARD,
        Event.AFTER_LOSS,
        Event.AFTER_BACKWARD,
        Event.EVAL_END,
        Event.EVAL_BATCH_END,
        Event.EVAL_AFTER_FORWARD,
    }
)
