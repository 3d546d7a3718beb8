"""The process around a run: ``torch.distributed``, signals (Ctrl-C, preemption), exit.

Internal: the user-facing parts are ``Trainer(preemption=...)`` and
:class:`~trainbus.Preemption`.
"""
