"""README and docs stand alone in a clone (issue 58): they name nothing outside the
repository, and every ```python block is Python that a test runs.

A block that is not meant to run (a signature outline, a sketch that needs a package the
tests do not install) is fenced ```python-outline (or ```text); ``tests/docs_pages.py`` says
the same. ``RUN_BY`` lists, for each page, the tests that run its ```python blocks and how
many each runs: a block added to a page fails here until a test runs it or it is fenced as
an outline.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_pages import BLOCK

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: page -> [(the test file that runs some of its ```python blocks, how many)].
RUN_BY: dict[str, list[tuple[str, int]]] = {
    "README.md": [("tests/test_readme.py", 4)],
    "callbacks.md": [("tests/test_docs_callbacks.py", 10)],
    "checkpoints.md": [("tests/test_docs_checkpoints.py", 8)],
    "crash-consistency.md": [("tests/test_docs_crash_consistency.py", 4)],
    "dashboard.md": [("tests/test_dashboard.py", 1)],
    "distributed.md": [
        ("tests/test_docs_distributed.py", 2),
        ("tests/integrations/test_ray.py", 1),  # the Ray Train block (slow suite)
    ],
    "loggers.md": [("tests/test_docs_loggers.py", 11)],
    "porting-from-composer.md": [("tests/test_docs_porting.py", 6)],
    "preemption.md": [("tests/test_docs_preemption.py", 6)],
    "service.md": [
        ("tests/test_docs_service.py", 3),  # EventStream, the httpx client, the job factory
        ("tests/test_serve.py", 2),  # examples/service/{starlette,trio}_embed.py, verbatim
    ],
    "training-loop.md": [("tests/test_docs_training_loop.py", 5)],
    "watching-a-run.md": [("tests/test_docs_watching.py", 3)],
    "where-the-time-went.md": [("tests/test_docs_time.py", 1)],
}

#: A relative reference: a Markdown link's target, or a path in backticks, that climbs.
CLIMBING = re.compile(r"(?:\]\(|`)((?:\.\./)+[^)`\s]*)")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_a_page_names_no_file_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in CLIMBING.findall(text):
        resolved = (page.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{page_id(page)} names {target!r}, outside"
    assert not re.search(r"\bSPEC\b", text), (
        f"{page_id(page)} cites the SPEC, which a clone does not have: say what it says"
    )
    assert "/shared/" not in text and "/work/" not in text, page_id(page)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_python_block_is_python(page: Path) -> None:
    for i, code in enumerate(BLOCK.findall(page.read_text(encoding="utf-8"))):
        try:
            compile(code, f"{page_id(page)}[#{i}]", "exec")
        except SyntaxError as exc:
            pytest.fail(
                f"{page_id(page)} block #{i} is fenced ```python but is not Python ({exc}); "
                "fence an outline ```python-outline"
            )


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_python_block_is_run_by_a_test(page: Path) -> None:
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    runners = RUN_BY.get(page.name, [])
    assert sum(n for _, n in runners) == len(blocks), (
        f"{page_id(page)} has {len(blocks)} ```python block(s), and RUN_BY says tests run "
        f"{sum(n for _, n in runners)}: run the new ones in a test (and count them here), or "
        "fence an outline ```python-outline"
    )
    for test, _ in runners:
        source = (ROOT / test).read_text(encoding="utf-8")
        assert page.name in source, f"{test} does not read {page.name}"
