"""One adapter per framework, with one interface (stdlib + torch + that framework only):

``VERSION``: the framework's version; ``make_fit(w, scenario, n, url) -> (fit, calls)``:
``fit(data)`` trains one epoch over ``data`` with ``n`` callbacks of ``scenario``
(and may return an untimed clean-up callable); ``calls``: handler calls per batch.

Scenarios: ``noop`` (a no-op on every per-batch hook the framework has), ``sleep``
(``time.sleep(0.005)`` at batch end), ``upload`` (one POST of the loss per batch to ``url``,
waited for: the same work in every framework; trainbus awaits it in an ``async def``),
and trainbus's own: ``noop-async``, ``noop-blocking``, ``uploader`` (``HTTPMetricsUploader``).
"""

ADAPTERS = ("plain", "trainbus_fw", "ignite_fw", "lightning_fw", "composer_fw")
