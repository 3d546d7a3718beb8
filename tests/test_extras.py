"""``pip install 'trainbus[all]'`` installs every extra a user may want (issue 58: it left
out wandb, ray, lightning and hf)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Extras for the project's own work, not a user's.
OWN = {"all", "test", "dev"}


def test_all_names_every_extra_a_user_may_want() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (spec,) = extras["all"]
    found = re.fullmatch(r"trainbus\[([a-z0-9,]+)\]", spec)
    assert found, spec
    assert set(found.group(1).split(",")) == set(extras) - OWN
