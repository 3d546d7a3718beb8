"""The README's first python code block runs as written after the README's install command.

The block is taken from ``README.md`` itself and executed exactly as printed, in a fresh
interpreter (the README promises a complete script); the packages it imports must be
what the README's ``pip install ... -e '.[extra]'`` installs.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def first_block(lang: str) -> str:
    found = re.search(rf"^```{lang}\n(.*?)^```$", README.read_text(), re.S | re.M)
    assert found, f"README.md has no ```{lang} block"
    return found.group(1)


def test_the_install_command_installs_what_the_first_example_imports() -> None:
    install = first_block("bash")
    extras = re.search(r"-e '\.\[([a-z,]+)\]'", install)
    assert extras, f"no `-e '.[extra]'` in the README's install command: {install!r}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras.group(1).split(","):
        requirements += project["optional-dependencies"][extra]
    installed = {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}
    imported = set()
    for node in ast.walk(ast.parse(first_block("python"))):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"trainbus"}
    assert third_party <= installed, (
        f"{sorted(third_party - installed)} not installed by {install!r}"
    )


def test_the_first_example_runs_as_printed_and_reports_what_it_overlapped(tmp_path: Path) -> None:
    script = tmp_path / "readme_example.py"
    script.write_text(first_block("python"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("TRAINBUS_PROGRESS", None)  # the default output, as the README shows it
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"20 batches in [\d.]+ s, [\d.]+ s of uploads beside them; "
        r"training waited [\d.]+ s for the uploads\n",
        done.stdout,
    ), done.stdout
    # The end-of-fit table the README shows, part by part, on stderr.
    table = README.read_text().split("```text\n", 1)[1].split("```", 1)[0]
    assert "where the time went (20 batches" in done.stderr
    for line in table.splitlines()[1:]:
        assert f"\n  {line.split()[0]} " in done.stderr, line


# -- "Use it with your trainer": each host's snippet runs as printed (issue 33) -------------

TRAINER_SECTION = "## Use it with your trainer"


def trainer_blocks() -> list[str]:
    text = README.read_text()
    assert TRAINER_SECTION in text, f"README.md has no {TRAINER_SECTION!r} section"
    section = text.split(TRAINER_SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)


def test_the_trainer_section_has_a_snippet_per_host() -> None:
    blocks = trainer_blocks()
    assert len(blocks) == 3
    assert "trainbus.Bus(" in blocks[0]
    assert "trainbus.integrations.lightning" in blocks[1]
    assert "trainbus.integrations.hf" in blocks[2]


@pytest.mark.parametrize(
    ("index", "needs"), [(0, None), (1, "pytorch_lightning"), (2, "transformers")],
    ids=["own-loop", "lightning", "hf"],
)
def test_each_trainer_snippet_runs_as_printed(
    index: int, needs: str | None, tmp_path: Path
) -> None:
    if needs is not None:
        pytest.importorskip(needs)
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(trainer_blocks()[index])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[1, 2, 3, 4]", done.stdout
