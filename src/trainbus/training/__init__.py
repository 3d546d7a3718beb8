"""The trainer: its configuration and checks, the batch conventions and the loop body.

Internal: import :class:`~trainbus.Trainer` from :mod:`trainbus`. The loop body runs on the
training thread and only calls ``publish(event)``; the bus (:mod:`trainbus.bus`) does the rest.
"""
