"""The ``trainbus`` command line, run as a user runs it: subprocesses, exit codes, output."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

#: Runs ``python -m trainbus ARGS`` with torch (and the service's packages) unimportable:
#: the help and the version must not need them.
WITHOUT_TORCH = (
    "import runpy, sys\n"
    "for name in ('torch', 'starlette', 'uvicorn', 'anyio', 'numpy'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['trainbus', *sys.argv[1:]]\n"
    "runpy.run_module('trainbus', run_name='__main__', alter_sys=True)\n"
)


def run_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip


@pytest.mark.parametrize("args", [(), ("--help",), ("-h",)], ids=["nothing", "--help", "-h"])
def test_help_answers_without_importing_torch_and_exits_0(args: tuple[str, ...]) -> None:
    result = run_without_torch(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: trainbus")
    for command in ("demo", "serve"):
        assert re.search(rf"^\s+{command}\s+\S", result.stdout, re.M), result.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_answers_without_importing_torch(flag: str) -> None:
    import trainbus

    result = run_without_torch(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trainbus {trainbus.__version__}"


def test_serve_help_lists_the_services_options_without_torch() -> None:
    result = run_without_torch("serve", "--help")
    assert result.returncode == 0, result.stderr
    for option in ("--host", "--port", "--max-running", "--buffer-size", "--token",
                   "--allow-host", "--insecure-no-token", "--log-level"):  # fmt: skip
        assert option in result.stdout, option
    assert "--stream-buffer" not in result.stdout  # the deprecated name is not advertised


def test_an_unknown_command_names_the_choices_and_exits_2() -> None:
    result = run_without_torch("bogus")
    assert result.returncode == 2
    assert "invalid choice: 'bogus'" in result.stderr and "'serve'" in result.stderr


def test_serve_rejects_a_bad_port_before_starting() -> None:
    result = run_without_torch("serve", "--port", "99999")
    assert result.returncode == 2
    assert "--port: '99999' must be a port from 0 to 65535" in result.stderr


def test_the_old_stream_buffer_option_warns_and_sets_buffer_size() -> None:
    from trainbus.__main__ import _parser

    with pytest.warns(DeprecationWarning, match="--stream-buffer is deprecated; use --buffer-size"):
        args = _parser().parse_args(["serve", "--stream-buffer", "16"])
    assert args.buffer_size == 16
    assert _parser().parse_args(["serve"]).buffer_size == 256


@pytest.mark.slow  # a child process that imports torch and uvicorn (about 4 s)
def test_trainbus_serve_serves_jobs() -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "trainbus", "serve", "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        found = re.fullmatch(r"trainbus\.serve: (http://127\.0\.0\.1:\d+)/?\n", line)
        assert found, (line, child.stderr.read() if child.poll() is not None else "")
        r = httpx.get(f"{found.group(1)}/jobs", timeout=30)
        assert r.status_code == 200 and r.json() == []
    finally:
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    assert child.returncode == 0
