"""The files of a sharded checkpoint: CRC-32s written beside its shards, a ``.metadata`` read
without running code.

``torch.distributed.checkpoint`` (DCP) writes one ``__<rank>_<n>.distcp`` file per rank and a
``.metadata`` pickle, and records no checksum: a flipped bit in a shard (or in the trainer
state blob inside it) loads silently, and ``FileSystemReader`` unpickles ``.metadata`` with
``pickle.load``, which runs whatever a hostile file asks for.

- :class:`ChecksumWriter` (saving, on DCP's writing thread): once a rank's shard files are
  written it writes ``<shard>.crc32`` beside each (``{"crc32": "<hex>", "size": n}``, to a
  temporary name, ``fsync``, rename), before DCP gathers the ranks' results, so before rank
  zero writes the commit marker ``.metadata``; rank zero then writes ``.metadata.crc32``.
- :func:`verify` (loading, every rank, before anything is unpickled): every shard file
  against its CRC-32 and size (``zlib.crc32``, which releases the GIL), ``.metadata`` too
  when its ``.crc32`` is there. Every rank checks every file, so every rank takes the same
  decision without a collective. A folder without any ``.crc32`` (written before trainbus
  recorded them, or not by trainbus) is not verified.
- :class:`SafeReader` / :func:`read_metadata`: ``.metadata`` is unpickled with an allow-list
  of DCP's metadata classes (:data:`ALLOWED`); any other global is refused with
  :class:`UnsafeMetadata`, nothing of it imported or called.
- :class:`SafePlanner` / :func:`load_item`: the byte items of the shard files (the trainer
  state blob ``trainer.rank<r>``, the optimizers' plain values) are ``torch.save`` archives that
  DCP's ``DefaultLoadPlanner.load_bytes`` loads with ``torch.load(weights_only=False)``, which
  runs whatever a hostile pickle asks for. trainbus unpickles them through the same allow-list
  (plus ``_codecs.encode`` for ``latin1``, how protocol 2 pickles ``bytes``); any other global
  is refused with :class:`UnsafeItem`, and no tensor storage is read from a byte item.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import zlib
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter

from trainbus.checkpoint.format import ArchiveDamaged, temp_path_for

__all__ = [
    "ALLOWED",
    "CHECKSUM_SUFFIX",
    "ChecksumWriter",
    "SafePlanner",
    "SafeReader",
    "UnsafeGlobal",
    "UnsafeItem",
    "UnsafeMetadata",
    "load_item",
    "read_metadata",
    "verify",
]

METADATA = ".metadata"
CHECKSUM_SUFFIX = ".crc32"
_CHUNK = 8 * 1024 * 1024
_DCP_METADATA = "torch.distributed.checkpoint.metadata"

#: ``(module, name)`` of every global a DCP ``.metadata`` may name (torch's dtypes and
#: layouts besides, checked by type): the metadata dataclasses, the file system's storage
#: record, ``torch.Size``, paths and ``OrderedDict``.
ALLOWED = frozenset({
    *((_DCP_METADATA, name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    *((module, name)  # Python 3.13 pickles paths from pathlib._local
      for module in ("pathlib", "pathlib._local")
      for name in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")),
    ("collections", "OrderedDict"),
})  # fmt: skip


class UnsafeGlobal(pickle.UnpicklingError):
    """A pickle in a sharded checkpoint names a global outside :data:`ALLOWED` (refused unread).

    Attributes:
        global_name: ``module.name`` of the refused global (nothing of it was imported).
    """

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.global_name = f"{module}.{name}"


class UnsafeMetadata(UnsafeGlobal):
    """A ``.metadata`` names a global that a DCP metadata never holds (refused, not loaded)."""


class UnsafeItem(UnsafeGlobal):
    """A byte item of a shard file names a global outside the allow-list (refused, not loaded).

    Attributes:
        item: The item's key in the checkpoint (``trainer.rank0``, say).
    """

    def __init__(self, module: str, name: str, item: str) -> None:
        super().__init__(module, name)
        self.item = item
        self.args = (f"{item}: {module}.{name}",)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout):
            return getattr(torch, name)
        raise UnsafeMetadata(module, name)


def _latin1(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: ``latin1`` only."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode called with {encoding!r}; only latin1")
    return text.encode("latin1")


class _ItemUnpickler(_Unpickler):
    """The allow-list of ``.metadata`` for one byte item; its refusals name the item."""

    def __init__(self, file: io.BytesIO, item: str) -> None:
        super().__init__(file)
        self.item = item

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        try:
            return super().find_class(module, name)
        except UnsafeMetadata:
            raise UnsafeItem(module, name, self.item) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(
            f"{self.item}: a byte item holds a tensor storage, which trainbus never writes there"
        )


def load_item(data: bytes, item: str) -> Any:
    """Unpickle the byte item ``item`` (a ``torch.save`` archive) through the allow-list.

    Raises:
        UnsafeItem: it names a global outside the allow-list (nothing of it was imported or
            called).
        pickle.UnpicklingError: it is not a ``torch.save`` archive, or holds a tensor.
    """
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(names) != 1:
                raise pickle.UnpicklingError(f"{item}: no single data.pkl in its archive")
            pickled = archive.read(names[0])
    except zipfile.BadZipFile:
        raise pickle.UnpicklingError(
            f"{item}: not a torch.save archive (DCP writes byte items as one)"
        ) from None
    return _ItemUnpickler(io.BytesIO(pickled), item).load()


def read_metadata(path: pathlib.Path) -> Any:
    """Unpickle the ``.metadata`` of the sharded checkpoint ``path`` through :data:`ALLOWED`.

    Raises:
        UnsafeMetadata: it names another global (nothing of it was imported or called).
        OSError, pickle.UnpicklingError, EOFError: it cannot be read or is not a pickle.
    """
    data = (path / METADATA).read_bytes()
    return _Unpickler(io.BytesIO(data)).load()


class SafeReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose ``read_metadata`` is :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """The folder's metadata, unpickled through the allow-list (``UnsafeMetadata``)."""
        from torch.distributed.checkpoint.metadata import StorageMeta

        metadata = read_metadata(pathlib.Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner`` whose byte items are read by :func:`load_item`."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        """Unpickle one byte item through the allow-list and put it into the state dict."""
        fqn = read_item.dest_index.fqn
        obj = load_item(value.getvalue(), fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def _crc32(path: pathlib.Path) -> tuple[int, int]:
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
    return crc, size


def _write_checksum(path: pathlib.Path) -> None:
    crc, size = _crc32(path)
    target = path.with_name(path.name + CHECKSUM_SUFFIX)
    tmp = temp_path_for(target)
    try:
        with open(tmp, "w") as f:
            json.dump({"crc32": f"{crc:08x}", "size": size}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ChecksumWriter(FileSystemWriter):
    """DCP's ``FileSystemWriter`` that writes a ``.crc32`` beside each file it wrote."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        """Write this rank's shards (DCP), then their checksums, before the commit marker."""
        future = super().write_data(plan, planner)
        names = {result.storage_data.relative_path for result in future.wait()}
        for name in sorted(names):
            _write_checksum(pathlib.Path(self.path) / name)
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        """Write ``.metadata`` (DCP: the commit marker), then its checksum (rank zero)."""
        super().finish(metadata, results)
        _write_checksum(pathlib.Path(self.path) / METADATA)


def verify(path: pathlib.Path) -> int | None:
    """Check every file of the sharded checkpoint ``path`` against its ``.crc32``.

    Returns the bytes checked, or ``None`` when the folder holds no checksum at all (written
    before trainbus recorded them, or by another program: not verified).

    Raises:
        ArchiveDamaged: a shard (or ``.metadata``) differs from its CRC-32 or size, a shard
            has no checksum while others do, or a checksum's file is gone (names the file).
    """
    shards = sorted(p for p in path.iterdir() if p.suffix == ".distcp")
    sums = sorted(p for p in path.iterdir() if p.name.endswith(CHECKSUM_SUFFIX))
    if not sums:
        return None
    checked = 0
    named = {p.name.removesuffix(CHECKSUM_SUFFIX) for p in sums}
    gone = sorted(named - {p.name for p in shards} - {METADATA})
    if gone:
        raise ArchiveDamaged(f"shard {gone[0]!r} is missing (its checksum is there)")
    files = [*shards, path / METADATA] if METADATA in named else shards
    for file in files:
        if file.name not in named:
            raise ArchiveDamaged(f"shard {file.name!r} has no {CHECKSUM_SUFFIX} (the others do)")
        try:
            record = json.loads(file.with_name(file.name + CHECKSUM_SUFFIX).read_text())
            want_crc, want_size = int(record["crc32"], 16), int(record["size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArchiveDamaged(f"the checksum of {file.name!r} cannot be read ({exc})") from exc
        crc, size = _crc32(file)
        if size != want_size:
            raise ArchiveDamaged(
                f"{file.name!r} holds {size} bytes where {want_size} were written (truncated)"
            )
        if crc != want_crc:
            raise ArchiveDamaged(
                f"{file.name!r} fails its CRC-32 check (recorded {want_crc:08x}, computed "
                f"{crc:08x}): its bytes were changed after it was written"
            )
        checked += size
    return checked
