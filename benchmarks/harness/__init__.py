"""The suite's shared code: workloads, framework adapters, the runner, statistics, the report.

Everything under ``harness/`` but ``report.py`` and ``runner.py`` needs only the standard
library and torch, so each peer's virtual environment can import it.
"""
