"""``python -m trainbus.serve`` (or ``trainbus serve``): the training service, demo job.

Example:
    $ python -m trainbus.serve --port 8000 --max-running 2
    $ curl --json '{"epochs": 2, "batches": 20}' localhost:8000/jobs

On loopback (the default) it needs no token unless ``--token`` sets one. On any other
address it generates one and prints the URL with it (as Jupyter does), unless
``--token`` gives one or ``--insecure-no-token`` says to serve other machines without.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# The options and the runner live above the packages, in one place for both commands,
# so that `trainbus --help` does not import the service (tests/test_layers.py, KNOWN).
from trainbus._serve_cli import add_arguments, run

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments and serve until interrupted (the same as ``trainbus serve``)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainbus.serve",
        description="Serve trainbus training jobs over HTTP (the demo MLP job).",
    )
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
