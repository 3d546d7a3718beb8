"""docs/integrations.md has a row for every hook each bridge implements, and no more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def table_hooks(section: str) -> set[str]:
    text = DOC.read_text().split(section, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    rows = [row for row in rows if " hook" not in row.split("|")[1]]  # not the header
    return {name for row in rows for name in re.findall(r"`(\w+)", row.split("|")[1])}


@pytest.mark.parametrize(
    ("module", "section", "base"),
    [
        ("trainbus.integrations.lightning", "## PyTorch Lightning", "pytorch_lightning.Callback"),
        ("trainbus.integrations.hf", "## Hugging Face", "transformers.TrainerCallback"),
    ],
)
def test_every_hook_the_bridge_implements_has_a_row(module: str, section: str, base: str) -> None:
    bridge_module = pytest.importorskip(module)
    host_module, _, base_name = base.rpartition(".")
    host_base = getattr(pytest.importorskip(host_module), base_name)
    bridge = bridge_module.TrainbusCallback
    implemented = {
        name for name, value in vars(bridge).items()
        if callable(value) and hasattr(host_base, name) and not name.startswith("_")
    }
    documented = table_hooks(section)
    assert implemented <= documented, sorted(implemented - documented)
    assert documented <= {*implemented, *dir(host_base), "training_step"}, sorted(
        documented - implemented
    )
