"""The package's layers: a package imports only the packages below it (issue 45, item 5).

``tests/test_bus_imports.py`` forbids import circles between modules; this checks the
direction between packages, in the order ``CONTRIBUTING.md``'s layout gives them. A lower
layer that needs something of a higher one asks for it through a small protocol (the
``Dashboard`` asks a trainer only for ``.engine``), or the code moves down (the dashboard's
page server lives beside the ``Dashboard`` callback, and the service imports it from there).

Imports under ``TYPE_CHECKING`` and inside functions count. The imports that still run
upward are listed in ``KNOWN``, each with who is fixing it; an entry that no longer exists
fails the test, so the list only shrinks.
"""

from __future__ import annotations

from tests.test_bus_imports import PACKAGE_DIR, imports_of, module_names

#: Lowest first. The top-level modules (``trainbus/__init__.py``, ``__main__``, ``_demo``)
#: are above every package.
LAYERS = (
    "core", "observe", "bus", "checkpoint", "runtime", "callbacks", "loggers", "training",
    "integrations", "serve",
)
TOP = len(LAYERS)

#: Upward imports that remain, (importer, imported) -> why it is still there: none left (the
#: last three asked the saver and uploader for class attributes, or moved up a layer).
KNOWN: dict[tuple[str, str], str] = {
    ("trainbus.serve.__main__", "trainbus._serve_cli"): (
        "`python -m trainbus.serve` and `trainbus serve` share one set of options, kept "
        "above the packages so that `trainbus --help` imports neither the service nor torch"
    ),
}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


def upward_imports() -> set[tuple[str, str]]:
    modules = module_names(PACKAGE_DIR, "trainbus")
    found = set()
    for name, path in modules.items():
        for target in imports_of(name, path, modules):
            if layer_of(target) > layer_of(name):
                found.add((name, target))
    return found


def test_every_package_imports_only_the_layers_below_it() -> None:
    unexpected = sorted(upward_imports() - KNOWN.keys())
    assert not unexpected, (
        "imports against the layering (lowest first: " + " < ".join(LAYERS) + "); ask for "
        "what you need through a protocol, or move the code down:\n  "
        + "\n  ".join(f"{a} -> {b}" for a, b in unexpected)
    )


def test_every_known_exception_still_exists() -> None:
    gone = sorted(KNOWN.keys() - upward_imports())
    assert not gone, f"fixed, remove them from KNOWN: {gone}"


def test_the_loop_owners_use_states_loop_interface_not_its_private_fields() -> None:
    """Regression: ``trainbus.Bus`` and the bridges counted batches with
    ``state._timer.on_batch_complete`` and cleared ``state._stop`` themselves."""
    import ast

    private = {"_timer", "_stop"}
    reaching = []
    for name, path in module_names(PACKAGE_DIR, "trainbus").items():
        if layer_of(name) < LAYERS.index("training") or layer_of(name) == TOP:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute) and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                reaching.append(f"{name}:{node.lineno} .{node.attr}")
    assert not reaching, (
        "use state.count_batch(), state.count_epoch(), state.begin_fit():\n  "
        + "\n  ".join(reaching)
    )


def test_the_bridges_take_every_option_of_the_bus() -> None:
    import inspect

    from trainbus import Bus
    from trainbus.integrations._hosting import BusKeywords

    own = {"callbacks", "loggers", "model", "optimizers", "schedulers", "max_duration",
           "train_dataloader", "eval_dataloader", "device", "run_name"}
    options = set(inspect.signature(Bus).parameters) - own
    assert options == set(BusKeywords.__annotations__)
