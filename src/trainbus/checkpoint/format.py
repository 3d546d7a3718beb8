"""What a checkpoint holds, how it is captured, and how it reaches the disk atomically.

Two halves with a hand-off between them:

- :func:`capture` runs on the training thread (in the saver's ``@blocking`` handler). It
  builds the checkpoint as plain containers whose tensors are *copies in host memory*
  (or, on CUDA, pinned host buffers whose copies are queued on the current stream, see
  :class:`Capture`), so training may go on changing the live tensors at once.
- :func:`write_atomic` runs on the saver's writer thread: ``torch.save`` to a hidden
  temporary file in the target folder, ``fsync``, then ``os.replace`` onto the final
  name and ``fsync`` of the folder. A crash at any point leaves either the old file (or
  none) or the complete new one under the final name; never a torn file.

The format is a dict (``FORMAT_KEY`` marks it) loadable with
``torch.load(..., weights_only=True)`` under :func:`safe_globals`: only tensors, plain
containers and the few trainbus types listed in :data:`SAFE_GLOBALS`.

Integrity: ``torch.save`` writes a zip archive whose members (the pickle, each storage's
bytes) carry a CRC-32 in the archive's directory, but ``torch.load`` never checks them, so
a flipped bit in tensor data loads silently. :func:`verify_archive` recomputes every
member's CRC-32 (``zlib.crc32``, which releases the GIL) and compares; loading calls it
first (``trainbus.checkpoint.resume``). :func:`write_atomic` makes sure the CRCs are
written (``torch.serialization.set_crc32_options``).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import errno
import os
import pathlib
import random
import secrets
import struct
import sys
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainbus.core.events import Event
from trainbus.core.exceptions import CheckpointSaveError
from trainbus.core.logger import LogLevel
from trainbus.core.time import Time, TimeUnit
from trainbus.core.timer import Timestamp, _make_timestamp

if TYPE_CHECKING:
    from trainbus.core.callback import Callback
    from trainbus.core.state import State

__all__ = [
    "ArchiveDamaged",
    "BufferPool",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "TEMP_MARKER",
    "Capture",
    "callback_keys",
    "capture",
    "capture_rng",
    "check_loadable",
    "restore_deque",
    "safe_globals",
    "temp_path_for",
    "to_host",
    "verify_archive",
    "write_atomic",
]

#: The key (and version) that marks a dict as a trainbus checkpoint.
FORMAT_KEY = "trainbus_checkpoint"
FORMAT_VERSION = 1
#: Temporary files are named ``.<final name>.<TEMP_MARKER><random>``: hidden, and never
#: taken for a checkpoint when resuming from a folder.
TEMP_MARKER = "partial-"


class _PortableDeque(collections.deque[Any]):
    """A deque that pickles through :func:`restore_deque` (``weights_only`` cannot extend one)."""

    def __reduce__(self) -> Any:
        return (restore_deque, (list(self), self.maxlen))


def restore_deque(items: list[Any], maxlen: int | None) -> collections.deque[Any]:
    """Rebuild a ``collections.deque`` saved in a checkpoint (an allow-listed global)."""
    return collections.deque(items, maxlen)


#: What ``torch.load(weights_only=True)`` may build besides tensors and plain containers.
#: Every public trainbus value a callback may keep in its ``state_dict()`` is one of them:
#: ``Event``, ``LogLevel``, ``Time``, ``TimeUnit``, ``Timestamp`` (``_make_timestamp``), and
#: ``deque`` (``restore_deque``).
SAFE_GLOBALS: list[Any] = [
    restore_deque, _make_timestamp, Time, TimeUnit, Event, LogLevel, frozenset,
]  # fmt: skip

# What check_loadable accepts: values the pickle stores without a global, types that
# torch's weights_only loader allows (besides tensors), and ours (by their pickled form).
_PLAIN_LEAVES = (type(None), bool, int, float, str, bytes)
_TORCH_LEAVES = (complex, bytearray, torch.Size, torch.dtype, torch.device)
_OUR_LEAVES = (Time, TimeUnit, Event, LogLevel, Timestamp)
_CONTAINERS = (
    dict, list, tuple, set, frozenset, collections.OrderedDict, collections.Counter,
    collections.deque,
)  # fmt: skip


def _user_safe_types() -> tuple[type, ...]:
    """The classes a user allowed with ``torch.serialization.add_safe_globals``."""
    get = getattr(torch.serialization, "get_safe_globals", None)
    found = []
    for entry in get() if get is not None else ():
        obj = entry[0] if isinstance(entry, tuple) else entry
        if isinstance(obj, type):
            found.append(obj)
    return tuple(found)


def check_loadable(value: Any, owner: str, path: str = "state_dict()") -> None:
    """Refuse a callback state that ``torch.load(weights_only=True)`` would not load back.

    Walks dict keys and values, lists, tuples, sets and deques. Accepts tensors, ``None``,
    ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``complex``, ``bytearray``,
    ``torch.Size``/``dtype``/``device``, trainbus's ``Event``, ``LogLevel``, ``Time``,
    ``TimeUnit``, ``Timestamp``, and classes allowed with
    ``torch.serialization.add_safe_globals``.

    Raises:
        CheckpointSaveError: names ``owner`` (the callback), the key path and the type.
    """
    _check(value, owner, path, None)


def _check(value: Any, owner: str, path: str, user: tuple[type, ...] | None) -> None:
    kind = type(value)
    if kind in _PLAIN_LEAVES or isinstance(value, torch.Tensor):
        return
    if kind in _CONTAINERS:
        if isinstance(value, dict):
            for key, item in value.items():
                _check(key, owner, f"{path} key {key!r}", user)
                _check(item, owner, f"{path}[{key!r}]", user)
        elif kind in (set, frozenset):
            for item in value:
                _check(item, owner, f"{path} item {item!r}", user)
        else:
            for i, item in enumerate(value):
                _check(item, owner, f"{path}[{i}]", user)
        return
    if kind in _TORCH_LEAVES or kind in _OUR_LEAVES:
        return
    user = _user_safe_types() if user is None else user
    if kind in user:
        return
    name = _import_name(kind)
    raise CheckpointSaveError(
        f"callback {owner}: {path} is a {name}, which a checkpoint cannot hold "
        "(Trainer(load_path=...) loads with torch.load(weights_only=True) and would refuse "
        "it); return plain containers, numbers, strings, tensors or trainbus's Event, "
        "LogLevel, Time, TimeUnit and Timestamp from state_dict() (e.g. convert it to a "
        "dict or a str), or allow the class with "
        f"torch.serialization.add_safe_globals([{kind.__qualname__}])"
    )


def _import_name(kind: type) -> str:
    """``kind``'s name as a user imports it: the shortest enclosing module that holds it
    (``pathlib.PurePosixPath``, not Python 3.13's ``pathlib._local.PurePosixPath``)."""
    parts = kind.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(module, kind.__qualname__, None) is kind:
            return f"{module.__name__}.{kind.__qualname__}"
    return f"{kind.__module__}.{kind.__qualname__}"


def safe_globals() -> Any:
    """A context in which checkpoints load with ``weights_only=True`` (our types allowed)."""
    scoped = getattr(torch.serialization, "safe_globals", None)
    if scoped is not None:
        return scoped(SAFE_GLOBALS)
    torch.serialization.add_safe_globals(SAFE_GLOBALS)  # torch < 2.5: no scoped form
    return contextlib.nullcontext()


#: Host buffers by ``(shape, dtype, pinned)``, reused from one capture to the next.
BufferPool = dict[tuple[Any, ...], list[torch.Tensor]]


@dataclass
class Capture:
    """A checkpoint captured on the training thread, ready for the writer.

    Attributes:
        payload: The checkpoint dict; its tensors live in host memory.
        ready: On CUDA, an event recorded after the queued device-to-host copies; the
            writer waits for it before reading ``payload``. ``None`` when the copies are
            already complete (CPU tensors are copied synchronously).
        host_bytes: Bytes of tensor data copied to the host.
        buffers: The host buffers the payload's tensors live in, by shape and dtype: once
            the payload is written, pass them as the next capture's ``pool``.
    """

    payload: dict[str, Any]
    ready: Any = None
    host_bytes: int = 0
    buffers: BufferPool = field(default_factory=dict)

    def wait(self) -> None:
        """Block until every queued device-to-host copy has landed (writer thread)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None

    def write(self, path: pathlib.Path) -> int:
        """:meth:`wait`, then :func:`write_atomic` the payload to ``path``; its size."""
        self.wait()
        return write_atomic(path, self.payload)


@dataclass
class _Copier:
    """Copies tensors to host memory; device tensors via pinned buffers, not blocking.

    ``pool`` holds host buffers of an earlier capture that the writer is done with:
    copying into a buffer that is already mapped costs a ``memcpy``; a fresh allocation
    also pays a page fault per page (about as much again). ``used`` collects the buffers
    of this capture, to be the next capture's pool.
    """

    pool: BufferPool = field(default_factory=dict)
    used: BufferPool = field(default_factory=dict)
    device_copies: bool = False
    nbytes: int = 0
    memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def _buffer(self, t: torch.Tensor, pinned: bool) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype, pinned)
        free = self.pool.get(key)
        out = free.pop() if free else torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned)
        self.used.setdefault(key, []).append(out)
        return out

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        if key in self.memo:  # the same tensor twice stays one tensor
            return self.memo[key][1]
        t_in, t = t, t.detach()
        self.nbytes += t.numel() * t.element_size()
        if t.layout is not torch.strided or t.device.type not in ("cpu", "cuda"):
            out = t.to("cpu", copy=True)  # sparse tensors, other devices: plain copy
        elif t.device.type == "cpu":
            out = self._buffer(t, pinned=False)
            out.copy_(t)
        else:
            out = self._buffer(t, pinned=True)
            out.copy_(t, non_blocking=True)
            self.device_copies = True
        self.memo[key] = (t_in, out)  # keeps t_in alive, so its id is not reused
        return out


def to_host(obj: Any, copier: _Copier | None = None) -> Any:
    """A deep copy of ``obj`` with every tensor copied to host memory.

    Containers are rebuilt (dicts keep their type, ``OrderedDict`` included); a
    ``deque`` becomes one that loads under ``weights_only``; other values are deep-copied
    so a callback that mutates its state after ``state_dict()`` returned cannot change
    the checkpoint being written.
    """
    copier = _Copier() if copier is None else copier
    if isinstance(obj, torch.Tensor):
        return copier.tensor(obj)
    if isinstance(obj, collections.OrderedDict):
        return collections.OrderedDict((k, to_host(v, copier)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: to_host(v, copier) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_host(v, copier) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_host(v, copier) for v in obj)
    if isinstance(obj, collections.deque):
        return _PortableDeque((to_host(v, copier) for v in obj), obj.maxlen)
    if obj is None or isinstance(obj, str | int | float | bool | bytes):
        return obj
    return copy.deepcopy(obj)


def callback_keys(callbacks: list[Callback]) -> Iterator[tuple[str, Callback]]:
    """``(key, callback)`` pairs: ``"<module>.<Class>#<n>"``, n counting that class.

    Two instances of one class get ``#0`` and ``#1``; adding a callback of another class
    to the run does not change the keys of the others.
    """
    seen: collections.Counter[str] = collections.Counter()
    for cb in callbacks:
        cls = type(cb)
        name = f"{cls.__module__}.{cls.__qualname__}"
        yield f"{name}#{seen[name]}", cb
        seen[name] += 1


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's (when installed), torch's and CUDA's generators."""
    version, internal, gauss = random.getstate()
    rng: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch wheels
        pass
    else:
        np_state = np.random.get_state(legacy=False)
        if isinstance(np_state, dict):
            rng["numpy"] = {
                "bit_generator": np_state["bit_generator"],
                "key": [int(k) for k in np_state["state"]["key"]],
                "pos": int(np_state["state"]["pos"]),
                "has_gauss": int(np_state["has_gauss"]),
                "gauss": float(np_state["gauss"]),
            }
    cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized
    if torch.cuda.is_available() and cuda_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def capture(
    state: State,
    *,
    weights_only: bool = False,
    epoch_rng: torch.Tensor | None = None,
    callback_states: Callable[[Callback], Any] | None = None,
    pool: BufferPool | None = None,
    include_model: bool = True,
) -> Capture:
    """Capture a consistent checkpoint of ``state`` (on the training thread).

    Args:
        state: The live training state (or a handler's view of it).
        weights_only: Capture the model's weights and the timestamp only.
        epoch_rng: torch's generator state when the current epoch's data iterator was
            made, so a mid-epoch resume can rebuild the same shuffled order.
        callback_states: ``callback -> state_dict`` (default: ``cb.state_dict()``).
        pool: Host buffers of an earlier capture, no longer in use, to copy into (see
            :attr:`Capture.buffers`); buffers whose shape and dtype match are reused.
        include_model: Capture the model and the optimizers (``False`` for a sharded
            checkpoint, which saves them with ``torch.distributed.checkpoint``).
    """
    copier = _Copier(pool={k: list(v) for k, v in (pool or {}).items()})
    timer = state.timer.state_dict()
    payload: dict[str, Any] = {
        FORMAT_KEY: FORMAT_VERSION,
        "weights_only": weights_only,
        "timestamp": dict(timer),
    }
    if include_model:
        payload["model"] = to_host(state.model.state_dict(), copier)
    if not weights_only:
        scaler = getattr(state, "scaler", None)
        get_state = callback_states or (lambda cb: cb.state_dict())
        callbacks: dict[str, Any] = {}
        for key, cb in callback_keys(state.callbacks):
            cb_state = get_state(cb)
            check_loadable(cb_state, key)  # refused now, not when the run resumes
            if cb_state:
                callbacks[key] = to_host(cb_state, copier)
        if include_model:
            payload["optimizers"] = [to_host(o.state_dict(), copier) for o in state.optimizers]
        payload.update(
            schedulers=[to_host(s.state_dict(), copier) for s in state.schedulers],
            scaler=None if scaler is None else to_host(scaler.state_dict(), copier),
            timer=dict(timer),
            rng=capture_rng(),  # fresh objects already
            epoch_rng=None if epoch_rng is None else epoch_rng.clone(),
            callbacks=callbacks,
        )
    ready = None
    if copier.device_copies:
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
    return Capture(payload, ready, copier.nbytes, copier.used)


def _fsync_dir(folder: pathlib.Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename still happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path_for(path: pathlib.Path) -> pathlib.Path:
    """A hidden, unique temporary name beside ``path``."""
    return path.with_name(f".{path.name}.{TEMP_MARKER}{secrets.token_hex(4)}")


class ArchiveDamaged(ValueError):
    """A checkpoint archive is torn or a member's bytes do not match its recorded CRC-32."""


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_CHUNK = 8 * 1024 * 1024


def verify_archive(path: pathlib.Path) -> int:
    """Check every member of the ``torch.save`` archive at ``path`` against its CRC-32.

    Reads each member's stored bytes straight from the file into one reused buffer and
    runs ``zlib.crc32`` over them (about as fast as the disk or page cache delivers them;
    ``benchmarks/investigations/bench_checkpoint_verify.py`` measures it). Returns the
    number of bytes checked.

    Raises:
        ArchiveDamaged: the file is not a complete zip archive (torn: its directory at the
            end is missing), or a member's bytes differ from its CRC-32 (names the member).
    """
    checked = 0
    with open(path, "rb") as f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ArchiveDamaged(f"not a complete zip archive ({exc})") from exc
        with archive:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            for info in archive.infolist():
                if info.compress_type != zipfile.ZIP_STORED:  # torch stores; others: zipfile
                    with archive.open(info) as member:  # checks the CRC as it reads
                        try:
                            while member.read(_CHUNK):
                                pass
                        except zipfile.BadZipFile as exc:
                            raise ArchiveDamaged(f"member {info.filename!r}: {exc}") from exc
                    checked += info.file_size
                    continue
                f.seek(info.header_offset)
                header = f.read(_LOCAL_HEADER.size)
                if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
                    raise ArchiveDamaged(f"member {info.filename!r}: bad local header")
                _, name_len, extra_len = _LOCAL_HEADER.unpack(header)
                f.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
                crc, left = 0, info.compress_size
                while left:
                    n = f.readinto(view[: min(left, _CHUNK)])
                    if not n:
                        raise ArchiveDamaged(f"member {info.filename!r}: truncated")
                    crc = zlib.crc32(view[:n], crc)
                    left -= n
                if crc != info.CRC:
                    raise ArchiveDamaged(
                        f"member {info.filename!r} fails its CRC-32 check (recorded "
                        f"{info.CRC:08x}, computed {crc:08x}): its bytes were changed after "
                        "it was written"
                    )
                checked += info.compress_size
    return checked


_CRC_LOCK = threading.Lock()


@contextlib.contextmanager
def _crc32_written() -> Iterator[None]:
    """``torch.save`` with CRC-32s computed (torch lets a user turn them off globally)."""
    get = getattr(torch.serialization, "get_crc32_options", None)
    if get is None or get():
        yield
        return
    with _CRC_LOCK:
        torch.serialization.set_crc32_options(True)
        try:
            yield
        finally:
            torch.serialization.set_crc32_options(False)


def _mount_of(folder: pathlib.Path) -> str:
    """``'<mount point> (<device>)'`` of the file system holding ``folder``."""
    where = folder.resolve()
    while not os.path.ismount(where) and where != where.parent:
        where = where.parent
    device = "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1 and fields[1] == str(where):
                device = fields[0]  # the last mount on a point is the visible one
    return f"{where} ({device})"


def _disk_full(exc: BaseException, folder: pathlib.Path) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not isinstance(exc, RuntimeError):
        return False
    # torch's zip writer reports a failed write as "[enforce fail at inline_container.cc:...]"
    # without the errno: look at the disk.
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < 1024 * 1024


def _no_space(path: pathlib.Path, tmp: pathlib.Path, exc: BaseException) -> OSError:
    folder = path.parent
    try:
        free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
        written = tmp.stat().st_size
    except OSError:
        free = written = -1
    return OSError(
        errno.ENOSPC,
        f"no space left on the disk mounted at {_mount_of(folder)} while writing the "
        f"checkpoint {path.name!r} into folder {str(folder)!r} ({written} bytes written, "
        f"{free} bytes free); free space there or pass CheckpointSaver a folder on another "
        "disk (num_checkpoints_to_keep=... bounds what a run keeps)",
        str(path),
    )


def write_atomic(path: pathlib.Path, payload: Mapping[str, Any]) -> int:
    """Serialise ``payload`` to ``path`` so that ``path`` is never a torn file.

    Writes a hidden temporary file in the same folder, flushes and ``fsync``s it, renames
    it onto ``path`` (atomic on POSIX and Windows) and ``fsync``s the folder. On any error
    the temporary file is removed and the error raised. Returns the file's size.

    Raises:
        OSError: ``ENOSPC`` when the disk is full, naming the disk, the folder and the file
            (torch's own error, ``RuntimeError: [enforce fail at inline_container.cc...]``,
            names none of them; it is kept as ``__cause__``). Other errors as raised.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as f, _crc32_written():
            torch.save(dict(payload), f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException as exc:
        full = isinstance(exc, Exception) and _disk_full(exc, path.parent)
        error = _no_space(path, tmp, exc) if full else None
        tmp.unlink(missing_ok=True)
        if error is not None:
            raise error from exc
        raise
    _fsync_dir(path.parent)
    return size
