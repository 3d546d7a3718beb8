"""One benchmark per row of SPEC section 7, in the order of its table.

Each module has ``FIGURE`` (the row's name in SPEC), optionally ``counts(quick)`` (the
callgrind configs it needs, per framework: the runner measures them all in one process
per framework, quiet and beside a neighbour) and one entry point ``run(ctx) -> list of
rows`` (``harness.stats.row``). trainbus-only measurements define ``measure(**kwargs)``,
which the runner calls in a fresh process (``ctx.child``).
"""

MODULES = (
    "call_blocking", "call_plain", "call_async", "batch_overhead", "growth", "run_event",
    "sleepers", "upload", "trailing_upload", "loop_wakeups", "many_callbacks",
    "thousand_callbacks", "first_example", "lateness", "memory", "checkpoint", "stop_agreement",
    "users_callbacks",
    "account_cost",
    "rank_times", "prometheus_metrics",
)
