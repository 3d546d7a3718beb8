"""Checkpoints in S3-compatible object storage: where they are, how to reach them, which is newest.

Shared by :class:`~trainbus.callbacks.CheckpointUploader` (which writes) and
``Trainer(load_path="s3://bucket/prefix")`` (which reads). The client is ``obstore``
(the ``s3`` extra), imported only here and only when a remote is used.

Layout under ``s3://bucket/prefix``: each checkpoint file under its name relative to the
saver's folder, and per rank a small manifest, ``trainbus-manifest-rank<r>.json``, listing
the complete checkpoints oldest first::

    {"format": 1, "checkpoints": [{"key": "ep0-ba20-rank0.pt", "size": 1234,
                                   "timestamp": {"epoch": 0, "batch": 20, ...}}]}

A checkpoint counts as complete only once it is in the manifest. The uploader adds it
after its object was created (S3 creates an object atomically when a ``PUT`` or a
multipart upload's ``CompleteMultipartUpload`` succeeds: a failed or interrupted upload
leaves no object under the key), and removes it *before* deleting a pruned object, so the
manifest never names an object that is missing or partial. The manifest is written by one
uploader per rank, one write at a time. Resuming reads the manifest, checks with ``HEAD``
that the newest entry's object exists with the recorded size (else it tries the next
older one) and downloads it.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import tempfile
from dataclasses import dataclass
from typing import IO, Any

__all__ = [
    "MANIFEST_FORMAT",
    "PinnedFile",
    "S3Options",
    "download_newest",
    "is_s3_url",
    "manifest_key",
    "parse_manifest",
    "parse_s3_url",
    "require_obstore",
    "transient",
]

MANIFEST_FORMAT = 1
_DOWNLOAD_CHUNK = 8 * 1024 * 1024


def is_s3_url(value: object) -> bool:
    """Whether ``value`` is a string starting with ``s3://``."""
    return isinstance(value, str) and value.startswith("s3://")


def parse_s3_url(url: object, name: str = "url") -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` (the prefix without a trailing ``/``).

    Raises:
        ValueError: ``url`` is not an ``s3://`` URL with a bucket, naming ``name``.
    """
    if not is_s3_url(url):
        raise ValueError(f"{name}={url!r} must be an S3 URL, e.g. 's3://my-bucket/run-1'")
    assert isinstance(url, str)
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{name}={url!r} has no bucket; write it as 's3://my-bucket/run-1'")
    return bucket, prefix.strip("/")


def manifest_key(rank: int) -> str:
    """The manifest's key, relative to the prefix, for ``rank``."""
    return f"trainbus-manifest-rank{rank}.json"


def parse_manifest(data: bytes, where: str) -> list[dict[str, Any]]:
    """The entries of a manifest (oldest first).

    Raises:
        ValueError: ``data`` is not a trainbus manifest (naming ``where``).
    """
    try:
        obj = json.loads(data)
        entries = obj["checkpoints"]
        if obj.get("format") != MANIFEST_FORMAT or not isinstance(entries, list):
            raise ValueError("unknown format")
        for e in entries:
            if not (isinstance(e["key"], str) and isinstance(e["size"], int)):
                raise ValueError("bad entry")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{where} is not a trainbus checkpoint manifest ({exc}); remove it or use another "
            "prefix"
        ) from None
    return entries


def require_obstore() -> Any:
    """Import ``obstore`` or explain how to install it."""
    try:
        import obstore
    except ImportError:
        raise ImportError(
            "checkpoints in S3 need the obstore package: pip install 'trainbus[s3]'"
        ) from None
    return obstore


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible store; ``None`` fields come from the environment.

    The standard AWS variables apply: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``,
    ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` (and the others obstore reads).

    Attributes:
        endpoint_url: e.g. ``"http://127.0.0.1:9000"`` for MinIO; ``http://`` is allowed.
        region: The bucket's region (default ``us-east-1`` when nothing is set).
        access_key_id: The access key.
        secret_access_key: The secret key.
        session_token: A temporary session token.
        max_retries: Retries of each request (a part of a multipart upload, a ``GET``)
            after a connection error, a dropped connection or a 5xx answer.
        retry_timeout: Seconds after a request's first attempt when it is retried no more.
        timeout: Seconds one request may take as a whole: a part of an upload, or the
            completion of a multipart upload, which a busy server may take long to
            assemble (obstore's default of 30 s is too short for that).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    max_retries: int = 10
    retry_timeout: float = 180.0
    timeout: float = 300.0

    def store(self, url: str, name: str = "url") -> Any:
        """An ``obstore`` ``S3Store`` for the bucket of ``url`` (keys relative to the prefix)."""
        from datetime import timedelta

        require_obstore()
        from obstore.store import S3Store

        bucket, prefix = parse_s3_url(url, name)
        env = os.environ
        endpoint = (
            self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        )
        region = self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        config: dict[str, Any] = {"region": region or "us-east-1"}
        if endpoint:
            config["endpoint"] = endpoint
        for key in ("access_key_id", "secret_access_key", "session_token"):
            value = getattr(self, key)
            if value is not None:
                config["token" if key == "session_token" else key] = value
        client = {
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "timeout": timedelta(seconds=self.timeout),
        }
        retry = {
            "max_retries": self.max_retries,
            "retry_timeout": timedelta(seconds=self.retry_timeout),
        }
        make: Any = S3Store  # its TypedDicts cannot be imported at run time
        return make(
            bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry
        )


@dataclass
class PinnedFile:
    """A handle on a checkpoint file's contents that outlives the file's deletion.

    A hidden hard link beside it (``.<name>.upload-<random>``: never taken for a
    checkpoint), which obstore reads without the GIL; an open file where links fail.
    """

    source: pathlib.Path | IO[bytes]
    size: int

    @classmethod
    def pin(cls, path: pathlib.Path) -> PinnedFile:
        link = path.with_name(f".{path.name}.upload-{secrets.token_hex(4)}")
        try:
            os.link(path, link)
        except OSError:
            file = open(path, "rb")  # noqa: SIM115 - closed by release()
            return cls(file, os.fstat(file.fileno()).st_size)
        return cls(link, link.stat().st_size)

    def body(self) -> pathlib.Path | IO[bytes]:
        """What to upload (a file is rewound for each try)."""
        if not isinstance(self.source, pathlib.Path):
            self.source.seek(0)
        return self.source

    def release(self) -> None:
        """Remove the link (or close the file)."""
        if isinstance(self.source, pathlib.Path):
            self.source.unlink(missing_ok=True)
        else:
            self.source.close()


def transient(exc: BaseException) -> bool:
    """Whether a failed upload is worth another try: not when the store refused the keys.

    A "not found" is tried again: besides a missing bucket it is what aborting a multipart
    upload answers when the server completed it after the client gave up waiting.
    """
    from obstore.exceptions import InvalidPathError, PermissionDeniedError, UnauthenticatedError

    refused = (InvalidPathError, PermissionDeniedError, UnauthenticatedError, PermissionError)
    return isinstance(exc, Exception) and not isinstance(exc, refused)


def _find_complete(
    store: Any, url: str, rank: int, skip: frozenset[str] = frozenset()
) -> dict[str, Any] | None:
    obstore = require_obstore()
    from obstore.exceptions import NotFoundError

    where = f"{url.rstrip('/')}/{manifest_key(rank)}"
    try:
        data = obstore.get(store, manifest_key(rank)).bytes()
    except (NotFoundError, FileNotFoundError):  # obstore raises either
        return None
    for entry in reversed(parse_manifest(bytes(data), where)):
        if entry["key"] in skip:
            continue
        try:
            meta = obstore.head(store, entry["key"])
        except (NotFoundError, FileNotFoundError):  # obstore raises either
            continue
        if int(meta["size"]) == entry["size"]:
            found: dict[str, Any] = entry
            return found
    return None


def download_newest(
    url: str, options: S3Options, rank: int, skip: frozenset[str] = frozenset()
) -> tuple[str, pathlib.Path] | None:
    """Download the newest complete checkpoint under ``url`` for ``rank`` to a temporary file.

    Returns ``(its s3:// URL, the local file)`` (the caller deletes the file), or ``None``
    when the prefix holds no complete checkpoint (no manifest yet: a first run). Entries
    whose key is in ``skip`` (found damaged by the caller) are passed over.

    Raises:
        OSError: the store cannot be reached or refuses (obstore's error, with a note).
    """
    obstore = require_obstore()
    store = options.store(url, "load_path")
    try:
        entry = _find_complete(store, url, rank, skip)
        if entry is None:
            return None
        fd, name = tempfile.mkstemp(prefix="trainbus-s3-", suffix=".pt")
        path = pathlib.Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                got = obstore.get(store, entry["key"])
                for chunk in got.stream(min_chunk_size=_DOWNLOAD_CHUNK):
                    f.write(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    except Exception as exc:
        exc.add_note(f"while reading the checkpoints under load_path={url!r}")
        raise
    return f"{url.rstrip('/')}/{entry['key']}", path
