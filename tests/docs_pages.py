"""Running the ```python examples of a page in ``docs/`` (shared by ``tests/test_docs_*.py``).

A page's blocks before its first ``## `` heading are the shared setup; each ``## `` section
runs the setup and then its own blocks, in order, in one namespace. Fence an example as
```text (or anything but ``python``) when it is not meant to run.
"""

from __future__ import annotations

import re
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

    def run(self, title: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the setup, then section ``title``'s blocks, in one namespace; return it."""
        if namespace is None:
            namespace = {"__name__": f"docs_{self.path.stem}_{title}"}
        for i, code in enumerate([*self.setup, *self.sections[title]]):
            exec(compile(code, f"{self.path.name}[{title} #{i}]", "exec"), namespace)
        return namespace
