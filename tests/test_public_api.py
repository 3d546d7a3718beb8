"""The public surface: ``__all__`` agrees with the exports, docstrings, lazy heavy imports.

As anyio's ``tests/test_all_attributes.py`` and httpx's ``tests/test_exported_members.py``:
the lists are computed from the modules, so names added later are checked too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
import types
from typing import Any

import pytest

PUBLIC_MODULES = ["trainbus", "trainbus.callbacks", "trainbus.loggers"]

# SPEC section 1: names that are part of the contract.
SPEC_NAMES = [
    "Event",
    "Callback",
    "State",
    "Timer",
    "Time",
    "TimeUnit",
    "Logger",
    "LoggerDestination",
    "Serializable",
    "Trainer",
    "Engine",
    "blocking",
]

HEAVY = ["httpx", "tensorboard", "tqdm", "starlette", "uvicorn", "obstore"]


def _public_attributes(module: types.ModuleType) -> set[str]:
    """Names a user sees on the module: not private, not submodules, not __future__ flags."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if name == "annotations" and value.__class__.__module__ == "__future__":
            continue
        names.add(name)
    return names


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_lists_exactly_the_public_attributes(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = set(module.__all__)
    public = _public_attributes(module)
    assert sorted(public - exported) == [], f"public in {module_name} but not in __all__"
    assert sorted(exported - public) == [], f"in {module_name}.__all__ but not defined"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_has_no_duplicates(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert len(module.__all__) == len(set(module.__all__))


def test_spec_names_are_exported() -> None:
    import trainbus

    missing = [name for name in SPEC_NAMES if name not in trainbus.__all__]
    assert missing == []
    for name in SPEC_NAMES:
        assert getattr(trainbus, name) is not None


def test_exports_are_the_defining_objects() -> None:
    """``trainbus.X`` is the object its private module defines (re-exported, not copied)."""
    import trainbus

    for name in trainbus.__all__:
        obj = getattr(trainbus, name)
        home = getattr(obj, "__module__", None)
        if home is None:
            continue
        assert home.startswith("trainbus"), (name, home)
        assert getattr(importlib.import_module(home), name, obj) is obj


def _exported_classes_and_functions() -> list[tuple[str, Any]]:
    """Every exported class and function (type aliases and constants carry no docstring)."""
    pairs = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                pairs.append((f"{module_name}.{name}", obj))
    return pairs


def _own_doc(obj: Any) -> str | None:
    """The object's own docstring (a dataclass's generated signature does not count)."""
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    generated = f"{obj.__name__}("  # what @dataclass writes when there is no docstring
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and (doc or "").startswith(generated):
        return None
    return doc


@pytest.mark.parametrize(
    ("qualname", "obj"), _exported_classes_and_functions(), ids=lambda x: str(x)
)
def test_every_public_name_has_a_docstring(qualname: str, obj: Any) -> None:
    doc = _own_doc(obj)
    assert (doc or "").strip(), f"{qualname} has no docstring"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_modules_have_docstrings(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert module.__doc__
    assert module.__doc__.strip()


def test_import_trainbus_does_not_import_heavy_dependencies() -> None:
    # torch.hub imports tqdm whenever it is installed, so torch is imported first; then the
    # heavy modules are made unimportable: `import trainbus` fails if it imports one.
    code = (
        "import json, sys\n"
        "import torch\n"
        f"for name in {HEAVY!r}:\n"
        "    sys.modules[name] = None\n"
        "try:\n"
        "    import trainbus\n"
        "except ImportError as exc:\n"
        "    print(json.dumps(str(exc)))\n"
        "else:\n"
        "    print(json.dumps(None))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    error = json.loads(result.stdout.strip().splitlines()[-1])
    assert error is None, f"import trainbus imported a heavy dependency: {error}"
