"""Every file and command the docs name exists in the repository (issue 45, item 1).

The pages of ``docs/`` and ``README.md`` named ``benchmarks/bench_dashboard.py``,
``src/trainbus/bus/_records.py`` and a dozen other files that had been deleted or renamed:
every command a reader copied failed. This test reads each page's text (prose and code
blocks alike) and checks that

- each ``path/to/file.py`` (and ``.sh``, ``.json``, ``.md``, ``.toml``, ``.png``) names a
  file of the repository, and each bare ``file.py`` (or ``.sh``) is the name of one;
- each ``python path.py ...`` / ``PYTHONPATH=src python path.py ...`` command names a
  script that exists, and each ``--option`` it passes appears in that script's text;
- each ``python -m module`` names an importable module (trainbus's from ``src/``);
- each ``tests/x.py::test_name`` names a test that the file defines.

The reader's own script (``python train.py``) and placeholders in angle brackets are the
only names it lets through (``USER_FILES``).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

#: Files the pages name that are the reader's own, not the repository's.
USER_FILES = frozenset({"train.py"})

EXTENSIONS = r"(?:py|sh|json|md|toml|png)"
#: A path-like token: letters, digits, ``_ - . /``, ending in a known extension.
PATH = re.compile(rf"(?<![\w/.<-])([\w.-]+(?:/[\w.-]+)*\.{EXTENSIONS})(::[\w\[\]-]+)?(?![\w/])")
#: ``python [-m mod | path.py] args`` up to the end of the span or line.
COMMAND = re.compile(r"(?:^|[\s`(;&$])python3?\s+([^`\n;&|)]+)")
IGNORED_REPO_FOLDERS = {".git", "__pycache__", ".venv", "node_modules"}


def repository_files() -> list[Path]:
    return [
        path for path in ROOT.rglob("*")
        if path.is_file() and not IGNORED_REPO_FOLDERS & set(path.relative_to(ROOT).parts)
    ]


FILES = repository_files()
NAMES = {path.name for path in FILES}


def resolve(token: str, page: Path) -> Path | None:
    """The file ``token`` names: from the repository root, the page's folder, or by name."""
    for base in (ROOT, page.parent):
        if (base / token).is_file():
            return base / token
    if "/" not in token and token in NAMES:
        return next(path for path in FILES if path.name == token)
    return None


def problems_of(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems: list[str] = []
    for found in PATH.finditer(text):
        token, test = found.group(1), found.group(2)
        if token in USER_FILES or token.startswith(("http", "www.")):
            continue
        if "/" not in token and not token.endswith((".py", ".sh")):
            continue  # a file a run writes (summary.json), named by its name alone
        if "." in token.split("/")[0] and "/" in token and not token.startswith("."):
            continue  # a host name (github.com/x/y.md), not a path
        path = resolve(token, page)
        if path is None:
            problems.append(f"{token}: no such file")
        elif test and not re.search(
            rf"^\s*(?:async )?def {re.escape(test[2:].split('[')[0])}\(",
            path.read_text(encoding="utf-8"), re.M,
        ):
            problems.append(f"{token}{test}: {path.name} defines no such test")
    for found in COMMAND.finditer(text):
        problems += command_problems(found.group(1), page)
    return problems


def command_problems(command: str, page: Path) -> list[str]:
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        words = command.split()
    if not words or "<" in words[0]:
        return []
    if words[0] == "-m":
        module = words[1] if len(words) > 1 else ""
        if module.startswith("trainbus"):
            return [] if module_in_src(module) else [f"python -m {module}: no such module"]
        if module != "pytest" and importlib.util.find_spec(module.split(".")[0]) is None:
            return [f"python -m {module}: no such module"]
        return []
    if words[0].startswith("-"):
        return []  # python -c ..., python -X ...: no file to check
    script = words[0]
    if not script.endswith(".py"):
        return []  # prose ("python 3.11"), not a command
    if script in USER_FILES:
        return []
    path = resolve(script, page)
    if path is None:
        return [f"python {script}: no such script"]
    source = path.read_text(encoding="utf-8")
    return [
        f"python {script} {word}: {script} has no option {word}"
        for word in words[1:]
        if word.startswith("--") and word.split("=")[0] not in source
    ]


def module_in_src(module: str) -> bool:
    base = ROOT / "src" / Path(*module.split("."))
    return (base / "__main__.py").is_file() or base.with_suffix(".py").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_file_and_command_a_page_names_exists(page: Path) -> None:
    problems = problems_of(page)
    assert not problems, f"{page.relative_to(ROOT)} names:\n  " + "\n  ".join(problems)


def test_the_check_sees_a_missing_file_a_missing_option_and_a_missing_test(
    tmp_path: Path,
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `PYTHONPATH=src python benchmarks/bench_gone.py --rounds 3`, then\n"
        "`python benchmarks/run.py --no-such-option`, see `src/trainbus/bus/_gone.py`,\n"
        "`tests/test_docs_paths.py::test_nothing_here` and `python -m no_such_module_45`.\n"
        "Fine: `python benchmarks/run.py --only call_async`, `python train.py`,\n"
        "`tests/test_docs_paths.py::test_every_file_and_command_a_page_names_exists`.\n",
        encoding="utf-8",
    )
    assert sorted(problems_of(page)) == sorted([
        "benchmarks/bench_gone.py: no such file",
        "python benchmarks/bench_gone.py: no such script",
        "python benchmarks/run.py --no-such-option: benchmarks/run.py has no option"
        " --no-such-option",
        "src/trainbus/bus/_gone.py: no such file",
        "tests/test_docs_paths.py::test_nothing_here: test_docs_paths.py defines no such test",
        "python -m no_such_module_45: no such module",
    ])
