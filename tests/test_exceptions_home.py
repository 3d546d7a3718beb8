"""Every exception trainbus defines for users lives in ``core/exceptions.py``.

Re-exported where users import it from (the old paths keep working, the same object), and
drawn in the module docstring's hierarchy. A module may keep a private exception that it
raises and catches itself (``PRIVATE``). The two classes once both named
``UploaderStatistics`` have distinct names, the old one still importable.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import trainbus
from trainbus.core import exceptions

HOME = Path(exceptions.__file__).resolve()

#: Raised and caught inside one module; users never see them.
# UnsafeGlobal and its two kinds: raised by checkpoint/dcp_files.py's unpicklers, caught by
# checkpoint/sharded.py, which raises CheckpointLoadError naming them.
PRIVATE = {
    "RequestTimeout", "RetryableReply", "UnsafeGlobal", "UnsafeMetadata", "UnsafeItem",
    "ArchiveDamaged",
}

PACKAGE = Path(trainbus.__file__).resolve().parent


def _exception_classes() -> dict[str, Path]:
    """Every class the package's sources define that derives from an exception (read from
    the sources: importing every module would import every optional dependency)."""
    bases: dict[str, tuple[Path, list[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                bases[node.name] = (path, names)
    found: dict[str, Path] = {}
    changed = True
    while changed:  # a class is an exception if one of its bases is
        changed = False
        for name, (path, names) in bases.items():
            if name not in found and any(
                base in found or base.endswith(("Error", "Exception", "Warning", "Exit"))
                or base == "UnpicklingError"
                for base in names
            ):
                found[name] = path
                changed = True
    return found


def test_every_exception_is_defined_in_core_exceptions() -> None:
    found = _exception_classes()
    assert {"TrainbusError", "LaneThreadError", "TrainingPreempted"} <= set(found)
    elsewhere = sorted(
        f"{name} ({path.relative_to(PACKAGE)})"
        for name, path in found.items()
        if path != HOME and not name.startswith("_") and name not in PRIVATE
    )
    assert not elsewhere, f"define these in core/exceptions.py: {elsewhere}"


def test_the_hierarchy_drawing_names_every_class() -> None:
    doc = exceptions.__doc__ or ""
    classes = [
        name for name, value in vars(exceptions).items()
        if inspect.isclass(value) and issubclass(value, BaseException | Warning)
        and value.__module__ != "builtins"
    ]
    assert len(classes) > 20
    assert [name for name in classes if f" {name} " not in doc and f" {name}\n" not in doc] == []


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("trainbus.bus", "LaneThreadError"),
        ("trainbus.bus", "Stopped"),
        ("trainbus", "TrainingPreempted"),
        ("trainbus.runtime.preemption", "TrainingPreempted"),
        ("trainbus.runtime.preemption", "HandlerAbandoned"),
        ("trainbus.serve", "ServiceClosedError"),
        ("trainbus.serve", "JobFactoryError"),
        ("trainbus.serve", "TooManyJobsError"),
    ],
)
def test_old_import_paths_give_the_same_class(old: str, name: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(exceptions, name)


def test_errors_trainbus_raises_are_trainbus_errors() -> None:
    for cls in (
        exceptions.LaneThreadError, exceptions.HandlerAbandoned, exceptions.ServiceClosedError,
        exceptions.JobFactoryError, exceptions.TooManyJobsError,
    ):
        assert issubclass(cls, exceptions.TrainbusError), cls
    assert issubclass(exceptions.LaneThreadError, RuntimeError)  # as before the move
    assert issubclass(exceptions.TrainingPreempted, SystemExit)


def test_the_two_uploader_statistics_have_distinct_names() -> None:
    from trainbus.callbacks import CheckpointUploadStatistics
    from trainbus.callbacks import UploaderStatistics as OldCheckpoint
    from trainbus.loggers import MetricsUploadStatistics
    from trainbus.loggers import UploaderStatistics as OldMetrics

    assert CheckpointUploadStatistics.__name__ != MetricsUploadStatistics.__name__
    assert OldCheckpoint is CheckpointUploadStatistics
    assert OldMetrics is MetricsUploadStatistics


def test_trainbus_bus_exports_what_users_use() -> None:
    import trainbus.bus as bus

    assert set(bus.__all__) == {
        "BusStatistics", "CallbackStatistics", "LaneThreadError", "PRODUCER_ROW",
        "TraceRecorder", "TraceSpan",
    }
    from trainbus.bus.options import BusOptions
    from trainbus.core.bridge import no_running_loop

    assert bus.BusOptions is BusOptions  # plumbing it once exported: still importable
    assert bus.no_running_loop is no_running_loop
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = bus.Nope  # type: ignore[attr-defined]
