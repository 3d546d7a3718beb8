"""``CONTRIBUTING.md``'s walk through the path of one event names what the code has.

Every name in backticks in the section "The path of one event" is a file of the package,
a member of :class:`~trainbus.Event`, or a dotted ``Owner.attribute`` where the owner is a
module (``producer``, ``lanes``) or a class (``Producer``, ``Lane``) of ``trainbus.bus``,
``trainbus.core`` or ``trainbus.training``, and the attribute exists: a module attribute, a
class attribute or slot, or an attribute its ``__init__`` (or another method) assigns
(``self.inbox = ...``); a bare lowercase name (``pending``: whose?) is not allowed. Code
fragments (``publish(Event.BATCH_END)``, ``@blocking``) are
not names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path
from types import ModuleType

import trainbus
from trainbus import Event

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(trainbus.__file__).parent
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _walk() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    start = text.index("## The path of one event")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _owners() -> dict[str, list[object]]:
    """Modules by their last name and classes by their name, in the three packages."""
    owners: dict[str, list[object]] = {}
    for package in ("trainbus.bus", "trainbus.core", "trainbus.training"):
        root = importlib.import_module(package)
        for info in pkgutil.iter_modules(root.__path__):
            module = importlib.import_module(f"{package}.{info.name}")
            owners.setdefault(info.name, []).append(module)
            for value in vars(module).values():  # its own classes and those it imports
                if inspect.isclass(value):
                    owners.setdefault(value.__name__, []).append(value)
    return owners


def _assigned(cls: type) -> set[str]:
    """The attributes methods of ``cls`` assign on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _has(owner: object, attr: str) -> bool:
    if isinstance(owner, ModuleType):
        return hasattr(owner, attr)
    assert isinstance(owner, type)
    if hasattr(owner, attr):
        return True
    return any(attr in _assigned(klass) for klass in owner.__mro__ if klass is not object
               and klass.__module__.startswith("trainbus"))


def test_every_name_the_walk_gives_exists() -> None:
    owners = _owners()
    names = re.findall(r"`([^`]+)`", _walk())
    assert len(names) > 40  # the walk was found and read
    missing = []
    for name in names:
        if name.endswith(".py"):
            if not ((PACKAGE / name).is_file() or (ROOT / name).is_file()):
                missing.append(name)
        elif re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
            if name not in Event.__members__:
                missing.append(name)
        elif re.fullmatch(r"[a-z_][a-z0-9_]*", name):  # a bare field: whose? qualify it
            missing.append(name)
        elif NAME.match(name):
            head, *rest = name.split(".")
            if head == "Event":
                if rest[0] not in Event.__members__:
                    missing.append(name)
                continue
            found = owners.get(head, [])
            if not found or not any(_has(owner, rest[0]) for owner in found):
                missing.append(name)
    assert not missing, f"CONTRIBUTING.md's walk names what the code lacks: {missing}"
