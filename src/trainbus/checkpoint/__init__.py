"""Checkpoints: what one holds and how it is written, resume, sharded (DCP) saves, S3.

Internal: the user-facing parts are :class:`~trainbus.callbacks.CheckpointSaver`,
:class:`~trainbus.callbacks.CheckpointUploader` and ``Trainer(load_path=...)``.
"""
