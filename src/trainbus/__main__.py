"""The ``trainbus`` command line (or ``python -m trainbus``): ``demo``, ``serve``, ``report``.

Each subcommand is a row of :data:`COMMANDS`: its arguments are argparse only, and its
runner imports what it needs (torch, the service) when it runs, so ``trainbus --help``
and ``trainbus --version`` answer at once.

Example:
    $ trainbus demo --epochs 3 --out runs/demo
    held-out accuracy: 94.00% on 450 digits (loss 0.195)
    ...
    0.23 s of callback work, 0.17 s of it hidden behind training (74%)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainbus import _serve_cli

__all__ = ["COMMANDS", "Command", "main"]


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. 20") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0, e.g. 20")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, e.g. 3") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1, e.g. 3")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number, e.g. 8050") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be a port from 0 to 65535")
    return value


@dataclass(frozen=True)
class Command:
    """One subcommand: its help, its arguments, and the runner that imports what it needs."""

    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--epochs", type=_positive_int, default=3, help="epochs (default 3)")
    demo.add_argument(
        "--out",
        default="./runs/demo",
        help="folder for metrics.jsonl and summary.json (default ./runs/demo)",
    )
    demo.add_argument(
        "--upload-latency-ms",
        type=_non_negative_float,
        default=20.0,
        help="simulated round trip per upload request, in ms (default 20)",
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument(
        "--dashboard",
        nargs="?",
        const=0,
        default=None,
        type=_port,
        metavar="PORT",
        help=(
            "serve a live dashboard on http://127.0.0.1:PORT/ (default: any free port) "
            "during the run; in a terminal it stays up after the run until Ctrl-C. Needs "
            "`pip install 'trainbus[service]'`"
        ),
    )


def _run_demo(args: argparse.Namespace) -> int:
    from trainbus._demo import run_demo


    try:
        board = None
        if args.dashboard is not None:
            from trainbus.callbacks.dashboard import Dashboard

            board = Dashboard(port=args.dashboard)
            board.start()
        try:
            run_demo(
                epochs=args.epochs,
                out=args.out,
                upload_latency_ms=args.upload_latency_ms,
                seed=args.seed,
                dashboard=board if board is not None else False,
            )
            if board is not None and sys.stdin.isatty():
                print(f"dashboard still at {board.url} (Ctrl-C to exit)", flush=True)
                _wait_for_ctrl_c()
        finally:
            if board is not None:
                board.stop()
    except ImportError as exc:
        print(f"trainbus demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the callbacks were closed; the shell's status for Ctrl-C
        print("trainbus demo: interrupted", file=sys.stderr)
        return 130
    return 0


def _report_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument(
        "run", metavar="RUN", help="a run folder (its metrics.jsonl) or a JSON-lines file"
    )
    report.add_argument(
        "--out", default=None, help="the page to write (default: report.html beside the file)"
    )


def _run_report(args: argparse.Namespace) -> int:
    from trainbus.report import write_report

    try:
        print(write_report(args.run, args.out))
    except FileNotFoundError as exc:
        print(f"trainbus report: {exc}", file=sys.stderr)
        return 1
    return 0


COMMANDS: dict[str, Command] = {
    "demo": Command(
        help="train a small MLP on scikit-learn's digits with slow async callbacks",
        description=(
            "Train an MLP on scikit-learn's handwritten digits with a progress bar, a "
            "JSON-lines metrics file and a simulated slow metrics uploader, then report "
            "the held-out accuracy and how much callback time hid behind training. "
            "Needs `pip install 'trainbus[demo]'`."
        ),
        add_arguments=_demo_arguments,
        run=_run_demo,
    ),
    "serve": Command(
        help="serve training jobs over HTTP (the demo job), with their live dashboards",
        description=(
            "Serve the training service (the same as `python -m trainbus.serve`): POST "
            "/jobs starts the demo job, GET /jobs/ID/events streams its events, "
            "/jobs/ID/dashboard shows it live. See docs/service.md. Needs "
            "`pip install 'trainbus[service,demo]'`."
        ),
        add_arguments=_serve_cli.add_arguments,
        run=_serve_cli.run,
    ),
    "report": Command(
        help="write one HTML page of a run: its curves and where its time went",
        description=(
            "Write one self-contained HTML page (no network needed to open it) from a run's "
            "JSON-lines metrics file: loss and metric curves with every logged point, the "
            "time account per epoch, the callbacks' costs, the batches it resumed from."
        ),
        add_arguments=_report_arguments,
        run=_run_report,
    ),
}
"""The subcommands, in the order ``--help`` lists them: name, arguments, runner."""


def _version() -> str:
    from trainbus import __version__

    return f"trainbus {__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainbus",
        description="trainbus: a PyTorch training loop whose callbacks run on an async bus.",
        epilog="Run `trainbus COMMAND --help` for a command's options.",
    )
    parser.add_argument("-V", "--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.description)
        command.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    With no command it prints the help and returns 0.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).

    Example:
        >>> main(["demo", "--epochs", "1", "--out", "/tmp/demo"])
        held-out accuracy: ...
        0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return COMMANDS[args.command].run(args)


def _wait_for_ctrl_c() -> None:
    import threading

    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
