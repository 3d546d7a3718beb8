"""What the README promises about itself: its first commands run on a fresh machine, and it
leads with what the library does, then the commands, the first example and the features,
with one performance table that names where its figures come from.

``tests/test_readme.py`` runs the README's code; this file checks its layout and the test
command's setup (issue 28: the test command failed on a fresh machine without Chromium; a
benchmark discussion sat above the features, with a benchmark's figure given as the demo's).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
BASH = re.findall(r"^```bash\n(.*?)^```$", TEXT, re.S | re.M)


def apt_packages(script: str) -> set[str]:
    """The packages of every ``apt-get install`` in ``script`` (options left out)."""
    packages: set[str] = set()
    for command in re.findall(r"apt-get install ([^&|;\n]+)", script):
        packages |= {word for word in shlex.split(command) if not word.startswith("-")}
    return packages


def test_the_first_two_commands_are_the_demo_and_the_tests() -> None:
    assert TEXT.index("```bash") > TEXT.index("**trainbus is a PyTorch training loop")
    assert "```python" not in TEXT[: TEXT.index("```bash")]  # no other code before them
    demo, tests = BASH[0].splitlines(), BASH[1].splitlines()
    assert demo == ["pip install 'torch==2.13.0' -e '.[demo]' && trainbus demo"]
    assert tests[-1] == "pip install 'torch==2.13.0' -e '.[test]' && python -m pytest"


def test_the_test_command_installs_the_system_packages_the_suite_needs() -> None:
    """Regression: only ``.ci/run`` installed Chromium, so every browser test errored when
    the README's test command ran on a fresh machine."""
    from tests.test_dashboard_browser import CHROMIUM

    setup = "\n".join(BASH[1].splitlines()[:-1])
    assert setup.startswith("apt-get update && apt-get install -y ")
    assert "chromium" in apt_packages(setup)
    assert CHROMIUM == "/usr/bin/chromium"  # where Debian's chromium package puts it
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert apt_packages(ci) <= apt_packages(setup)  # what CI installs, the README does too


def test_the_readme_says_how_long_the_suite_takes_and_what_slow_adds() -> None:
    after = TEXT[TEXT.index(BASH[1]) :]
    assert re.search(r"The suite takes about \d+ minutes", after)
    assert "`python -m pytest -m slow` runs what the default run leaves out" in after


def test_what_it_does_the_example_and_the_features_come_before_the_performance() -> None:
    example = TEXT.index("```python")
    features = TEXT.index("## Features")
    performance = TEXT.index("## Performance")
    assert TEXT.index(BASH[1]) < example < features < performance
    assert features < TEXT.index("- **Composer's callback API.**") < performance


def test_one_performance_table_that_names_the_source_of_its_figures() -> None:
    separators = [line for line in TEXT.splitlines() if re.fullmatch(r"\|(-+\|)+", line)]
    assert len(separators) == 1  # one table
    # The table is generated: between the markers `benchmarks/run.py --update-readme` fills,
    # under the line that names the command and the file every figure comes from.
    start, end = TEXT.index("<!-- perf-table -->"), TEXT.index("<!-- /perf-table -->")
    block = TEXT[start:end]
    assert start < TEXT.index(separators[0]) < end
    assert "`python benchmarks/run.py`" in block.splitlines()[1]
    assert "benchmarks/README.md" in block.splitlines()[1]
    assert TEXT.index(separators[0]) > TEXT.index("## Performance")
    assert (ROOT / "benchmarks" / "run.py").is_file()


def test_no_benchmark_figure_is_given_as_the_demos() -> None:
    """Regression: "96% hidden" came from a benchmark while ``trainbus demo`` prints its
    own share (36% in the run the issue quotes)."""
    assert not re.search(r"\d+% hidden", TEXT)
    assert "Where each figure in this README comes from" in TEXT


def test_the_versions_claimed_are_the_versions_ci_tests() -> None:
    """Issue 45: ``torch>=2.4`` and Python 3.12/3.13 were claimed while CI ran one pair. The
    torch range in pyproject.toml, the Python classifiers and the README's sentence must name
    exactly the pairs that ``.ci/run`` and ``.ci/versions`` run."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    torch_requirement = next(d for d in project["dependencies"] if d.startswith("torch"))
    versions_script = (ROOT / ".ci" / "versions").read_text(encoding="utf-8")
    pairs_line = re.search(r"pairs=\((3\.[^)]*)\)", versions_script)
    assert pairs_line is not None, ".ci/versions lost its default list of pairs"
    pairs = [tuple(p.split(":")) for p in pairs_line.group(1).split()]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/versions" in ci, ".ci/run must run the other claimed versions"
    main_torch = re.search(r"'torch==([\d.]+)' -e '\.\[test\]'", ci)
    assert main_torch is not None
    tested_torch = {main_torch.group(1)} | {torch for _, torch in pairs}
    tested_python = {"3.11"} | {py for py, _ in pairs}

    lowest = re.search(r">=([\d.]+)", torch_requirement)
    assert lowest is not None
    oldest = min(tested_torch, key=lambda v: tuple(map(int, v.split("."))))
    assert oldest.startswith(lowest.group(1) + "."), (
        f"{torch_requirement!r} claims torch below what CI tests ({sorted(tested_torch)})"
    )
    classified = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert classified == tested_python
    sentence = " ".join(TEXT.split())
    assert f"accepts `{torch_requirement}`" in sentence
    for py, torch in pairs:
        assert py in sentence and torch in sentence
