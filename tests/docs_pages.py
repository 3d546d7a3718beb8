"""Running the ```python examples of a page in ``docs/`` (shared by ``tests/test_docs_*.py``).

A page runs as a reader runs it: every block, top to bottom, in one namespace, in one
working folder (:meth:`Page.run_all`; the caller chooses the folder). The blocks before the
first ``## `` heading are the shared setup (``Page.setup``), the others belong to their
section (``Page.sections``), which :meth:`Page.run` can run alone after the setup to check
what that section prints. Fence an example as ```python-outline (a signature outline, a
sketch that needs what the tests do not install) or ```text when it is not meant to run:
``tests/test_docs_standalone.py`` checks that every ```python block of README and docs is
Python that a test runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BLOCK", "DOCS", "Page"]

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Page:
    """A page's runnable examples: the setup blocks, and the blocks of each section."""

    path: Path
    setup: list[str]
    sections: dict[str, list[str]]

    @classmethod
    def read(cls, name: str) -> Page:
        """The page ``docs/<name>``; ``sections`` lists only sections with examples."""
        path = DOCS / name
        parts = re.split(r"^## (.+)$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
        sections = {
            title.strip(): BLOCK.findall(body)
            for title, body in zip(parts[1::2], parts[2::2], strict=True)
        }
        return cls(path, BLOCK.findall(parts[0]),
                   {title: blocks for title, blocks in sections.items() if blocks})

    @property
    def text(self) -> str:
        """The page's text, as it is now."""
        return self.path.read_text(encoding="utf-8")

    @property
    def blocks(self) -> list[tuple[str, str]]:
        """Every block of the page in its order, as ``(section title or "setup", code)``."""
        return [("setup", code) for code in self.setup] + [
            (title, code) for title, blocks in self.sections.items() for code in blocks
        ]

    def run_all(
        self,
        namespace: dict[str, Any] | None = None,
        *,
        after: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run every block of the page, top to bottom, in one namespace; return it.

        Run it in a fresh folder (``monkeypatch.chdir(tmp_path)``): a reader who copies
        the page into one script, or one notebook, runs every section in the same folder.
        ``after(title)`` is called after each block (e.g. to collect what it printed).
        """
        if namespace is None:
            namespace = {"__name__": f"docs_{self.path.stem}"}
        for i, (title, code) in enumerate(self.blocks):
            exec(compile(code, f"{self.path.name}[{title} #{i}]", "exec"), namespace)
            if after is not None:
                after(title)
        return namespace

    def run_all_printing(
        self, capsys: Any, namespace: dict[str, Any] | None = None
    ) -> dict[str, str]:
        """:meth:`run_all`, returning what each section printed (``"setup"`` for the setup).

        ``capsys`` is pytest's fixture: each block's output is read right after it runs.
        """
        printed: dict[str, str] = {}

        def collect(title: str) -> None:
            printed[title] = printed.get(title, "") + capsys.readouterr().out

        self.run_all(namespace, after=collect)
        return printed

    def run(self, title: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the setup, then section ``title``'s blocks, in one namespace; return it."""
        if namespace is None:
            namespace = {"__name__": f"docs_{self.path.stem}_{title}"}
        for i, code in enumerate([*self.setup, *self.sections[title]]):
            exec(compile(code, f"{self.path.name}[{title} #{i}]", "exec"), namespace)
        return namespace
