"""``CheckpointUploader``: each checkpoint a saver completes, uploaded to S3 while training goes on.

The saver's writer thread hands over each file once it is complete on disk
(:meth:`CheckpointSaver.add_listener`); the uploader pins it there with a hidden hard
link (so the saver may prune the local file at once) and queues it for the uploader's
``background`` task, which runs on the fit's own event loop and starts one upload task
per file (the hand-over wakes that task through the bus's bridge,
:class:`~trainbus.core.bridge.LoopHandle`). Uploads use ``obstore`` (Rust; multipart for
files larger than ``part_size``, ``part_concurrency`` parts in flight; the GIL is released
while bytes move): its ``*_async`` functions under asyncio, which need an asyncio loop;
under trio its blocking functions, each in an anyio worker thread (an upload cancelled at
``close_timeout`` then returns at once and its thread ends with its request). At most
``max_in_flight`` uploads are unfinished: a further hand-off waits, which holds the
saver's writer, so the next save waits too (no checkpoint is skipped, memory and disk
stay bounded). How a checkpoint becomes complete remotely, and how resuming finds it:
:mod:`trainbus.checkpoint.s3`.
"""

from __future__ import annotations

import functools
import json
import pathlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from trainbus.callbacks.checkpoint_saver import CheckpointSaver, _rank
from trainbus.checkpoint.s3 import (
    MANIFEST_FORMAT,
    PinnedFile,
    S3Options,
    manifest_key,
    parse_manifest,
    parse_s3_url,
    transient,
)
from trainbus.core.bridge import LoopHandle
from trainbus.core.callback import Callback, blocking
from trainbus.core.threads import run_in_thread
from trainbus.core.timer import Timestamp

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["CheckpointUploadStatistics", "CheckpointUploader", "UploaderStatistics"]

_ROLE = "It runs the CheckpointUploader's blocking calls (object store, the saver's wait)"

_MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CheckpointUploadStatistics:
    """What uploading cost so far (seconds are wall-clock).

    Attributes:
        handed_over: Checkpoints the saver handed over.
        uploaded: Checkpoints complete remotely (in the manifest).
        bytes_uploaded: Their total size.
        upload_seconds: Total time from the start of an upload to its completion.
        retries: Whole uploads attempted again after a failure (requests a client retried
            on its own, such as one part of a multipart upload, are not counted).
        pruned: Remote checkpoints deleted to keep ``num_checkpoints_to_keep``.
        wait_seconds: Time the saver's writer waited for an upload slot.
    """

    handed_over: int
    uploaded: int
    bytes_uploaded: int
    upload_seconds: float
    retries: int
    pruned: int
    wait_seconds: float


#: The old name of :class:`CheckpointUploadStatistics` (``trainbus.callbacks.UploaderStatistics``;
#: ``trainbus.loggers`` has a class of that name too: ``MetricsUploadStatistics``).
UploaderStatistics = CheckpointUploadStatistics


def _positive_int(value: Any, name: str, example: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = "a positive int" if low else "an int >= 0"
        raise ValueError(f"{name}={value!r} must be {what}, e.g. {example}")
    return value


@dataclass(frozen=True, slots=True)
class _Job:
    """A file handed over by the saver's writer, waiting for its upload task."""

    key: str
    source: PinnedFile
    timestamp: Timestamp
    seq: int


class CheckpointUploader(Callback):
    """Uploads each checkpoint of a :class:`CheckpointSaver` to ``s3://bucket/prefix``.

    Pass both to the Trainer. Each file the saver completes is uploaded under its name
    relative to the saver's folder, concurrently with training; once its object exists in
    full it is added to the prefix's manifest, and the oldest are deleted beyond
    ``num_checkpoints_to_keep``. ``Trainer(load_path="s3://bucket/prefix")`` resumes from
    the newest complete one (with this uploader's endpoint and credentials when it is in
    the run's callbacks). An upload that still fails after ``attempts`` is raised from
    ``fit()`` (at the next checkpoint event, or at close); ``close`` waits for the uploads
    in flight, up to ``close_timeout``.

    Args:
        saver: The saver whose checkpoints are uploaded (must be in the same run).
        url: ``"s3://bucket/prefix"``; the prefix belongs to this run and its resumes.
        endpoint_url: The S3 endpoint (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``).
        region: The region (``AWS_REGION``, ``AWS_DEFAULT_REGION``; else ``us-east-1``).
        access_key_id: ``AWS_ACCESS_KEY_ID`` when not given.
        secret_access_key: ``AWS_SECRET_ACCESS_KEY`` when not given.
        session_token: ``AWS_SESSION_TOKEN`` when not given.
        num_checkpoints_to_keep: Remote checkpoints to keep (oldest deleted); ``-1``
            keeps all; default: the saver's.
        max_in_flight: Uploads unfinished at once; a further checkpoint waits for one.
        part_size: Bytes per part; larger files are uploaded in parts (at least 5 MiB).
        part_concurrency: Parts of one upload in flight at once.
        attempts: Tries of a whole upload (each request is also retried by the client).
        backoff: Seconds before the second try; doubles per try.
        max_retries: Retries of each request (a part, the manifest) by the client.
        close_timeout: Seconds ``close`` waits for the saver's last write and the uploads
            in flight; those still unfinished then are cancelled and reported.

    Example:
        >>> saver = CheckpointSaver("ckpt", save_interval="20ba", num_checkpoints_to_keep=3)
        >>> uploader = CheckpointUploader(saver, "s3://my-bucket/run-1")
        >>> Trainer(model, loader, "2ep", callbacks=[saver, uploader]).fit_sync()
        >>> Trainer(model, loader, "4ep", load_path="s3://my-bucket/run-1")  # resumes
    """

    uploads_checkpoint_files = True  # refused with an FSDP model (runtime/distributed.py)

    def __init__(
        self,
        saver: CheckpointSaver,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        num_checkpoints_to_keep: int | None = None,
        max_in_flight: int = 2,
        part_size: int = 16 * _MiB,
        part_concurrency: int = 8,
        attempts: int = 3,
        backoff: float = 1.0,
        max_retries: int = 10,
        close_timeout: float = 600.0,
    ) -> None:
        if not isinstance(saver, CheckpointSaver):
            raise TypeError(
                f"saver={saver!r} must be a trainbus.callbacks.CheckpointSaver; pass the "
                "saver whose checkpoints to upload"
            )
        parse_s3_url(url, "url")
        self.saver, self.url = saver, url.rstrip("/")
        keep = num_checkpoints_to_keep
        if keep is None:
            keep = saver.num_checkpoints_to_keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep == 0 or keep < -1:
            raise ValueError(
                f"num_checkpoints_to_keep={keep!r} must be -1 (keep all) or a positive int, e.g. 3"
            )
        self.num_checkpoints_to_keep = keep
        self.max_in_flight = _positive_int(max_in_flight, "max_in_flight", "2")
        self.part_size = _positive_int(part_size, "part_size", "16 * 1024 * 1024")
        if part_size < 5 * _MiB:
            raise ValueError(f"part_size={part_size!r} must be at least 5 MiB (S3's minimum part)")
        self.part_concurrency = _positive_int(part_concurrency, "part_concurrency", "8")
        self.attempts = _positive_int(attempts, "attempts", "3")
        if not isinstance(backoff, int | float) or not backoff >= 0:
            raise ValueError(f"backoff={backoff!r} must be seconds >= 0, e.g. 1.0")
        self.backoff = float(backoff)
        if not isinstance(close_timeout, int | float) or not close_timeout > 0:
            raise ValueError(f"close_timeout={close_timeout!r} must be seconds > 0, e.g. 600.0")
        self.close_timeout = float(close_timeout)  # the bus gives close this long, too
        self.options = S3Options(
            endpoint_url, region, access_key_id, secret_access_key, session_token,
            max_retries=_positive_int(max_retries, "max_retries", "10", low=0),
        )  # fmt: skip
        self._store = self.options.store(url)  # needs obstore: fails here, not mid-run
        self._slots = threading.BoundedSemaphore(self.max_in_flight)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._jobs: deque[_Job] = deque()  # the writer appends, the loop takes
        self._loop: LoopHandle | None = None  # set while ``background`` takes jobs
        self._wakeup: anyio.Event | None = None  # loop only, as is what follows
        self._running: set[anyio.CancelScope] = set()  # one per upload task
        self._ended: anyio.Event | None = None  # set (and replaced) when an upload ends
        self._entries: list[dict[str, Any]] | None = None  # the manifest
        self._order: dict[str, int] = {}
        self._seq = 0
        self._manifest_lock: anyio.Lock | None = None
        self._stats = dict.fromkeys(
            ("handed", "uploaded", "bytes", "seconds", "retries", "pruned", "wait"), 0.0
        )

    # -- public ------------------------------------------------------------------------------

    @property
    def uploaded_checkpoints(self) -> list[tuple[Timestamp, str]]:
        """``(timestamp, s3 URL)`` of each checkpoint complete remotely, oldest first."""
        with self._lock:
            entries = list(self._entries or [])
        return [(Timestamp(**e["timestamp"]), f"{self.url}/{e['key']}") for e in entries]

    def statistics(self) -> CheckpointUploadStatistics:
        """Counts and times of the uploads so far (see :class:`CheckpointUploadStatistics`)."""
        s = self._stats
        return CheckpointUploadStatistics(
            handed_over=int(s["handed"]), uploaded=int(s["uploaded"]),
            bytes_uploaded=int(s["bytes"]), upload_seconds=s["seconds"],
            retries=int(s["retries"]), pruned=int(s["pruned"]), wait_seconds=s["wait"],
        )  # fmt: skip

    # -- handlers ----------------------------------------------------------------------------

    @blocking
    def fit_start(self, state: State, logger: Logger) -> None:
        """Check the saver is in the run and start receiving its files."""
        if not any(cb is self.saver for cb in state.callbacks):
            raise ValueError(
                "CheckpointUploader: its saver is not in the Trainer's callbacks; pass "
                "callbacks=[saver, uploader]"
            )
        self.saver.add_listener(self._hand_over)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        """Raise an upload error, if any (the run stops)."""
        self._raise_error()

    def epoch_checkpoint(self, state: State, logger: Logger) -> None:
        """Raise an upload error, if any (the run stops)."""
        self._raise_error()

    async def background(self, state: State, logger: Logger) -> None:
        """Start an upload task for each file handed over, for the whole fit (loop)."""
        self._manifest_lock, self._ended = anyio.Lock(), anyio.Event()
        wakeup = self._wakeup = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                self._loop = LoopHandle()  # from now on a hand-over wakes this task
                while True:
                    while self._jobs:  # those handed over before, too
                        job = self._jobs.popleft()
                        scope = anyio.CancelScope()
                        self._running.add(scope)
                        tg.start_soon(self._run, job, scope)
                    await wakeup.wait()
                    wakeup = self._wakeup = anyio.Event()
        finally:
            self._loop = self._wakeup = None
            self._drop_queued()

    async def close(self, state: State, logger: Logger) -> None:
        """Wait for the saver's last write and every upload; raise an error not yet raised.

        Uploads unfinished after ``close_timeout`` are cancelled (the manifest names only
        complete checkpoints) and reported with a ``TimeoutError``.
        """
        deadline = anyio.current_time() + self.close_timeout
        await run_in_thread(
            self.saver.wait_written, self.close_timeout, abandon_on_cancel=True, needed=_ROLE
        )
        self.saver.remove_listener(self._hand_over)
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            while self._ended is not None and (self._running or self._jobs):
                await self._ended.wait()
        pending = len(self._running) + self._drop_queued()
        for scope in self._running:
            scope.cancel()
        with anyio.CancelScope(shield=True):
            while self._ended is not None and self._running:  # a cancelled upload ends
                await self._ended.wait()  # at once, releasing its file
        if pending:
            error = TimeoutError(
                f"CheckpointUploader: {pending} upload(s) to {self.url!r} did not finish "
                f"within close_timeout={self.close_timeout:g} s and were cancelled (they are "
                "not in the manifest); pass a larger close_timeout="
            )
            with self._lock:
                self._error = self._error or error
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is None:
            return
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _drop_queued(self) -> int:
        """Release the files of jobs no upload task took (loop); return how many."""
        dropped = 0
        while self._jobs:
            self._jobs.popleft().source.release()
            self._slots.release()
            dropped += 1
        return dropped

    # -- the saver's writer thread -----------------------------------------------------------

    def _hand_over(self, timestamp: Timestamp, path: pathlib.Path) -> None:
        try:
            key = path.relative_to(self.saver.folder).as_posix()
        except ValueError:
            key = path.name
        t0 = time.perf_counter()
        self._slots.acquire()  # at most max_in_flight unfinished: the writer waits here
        self._stats["wait"] += time.perf_counter() - t0
        try:
            source = PinnedFile.pin(path)  # the saver may prune the file before the upload is done
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._stats["handed"] += 1
            seq, self._seq = self._seq, self._seq + 1
        self._jobs.append(_Job(key, source, timestamp, seq))
        loop = self._loop  # None until ``background`` runs: it takes the job when it does
        if loop is not None:
            loop.call_soon_if_running(self._poke)

    # -- the fit's event loop ----------------------------------------------------------------

    def _poke(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _run(self, job: _Job, scope: anyio.CancelScope) -> None:
        try:
            with scope:
                await self._upload(job.key, job.source, job.timestamp, job.seq)
        finally:
            self._running.discard(scope)
            self._slots.release()
            ended, self._ended = self._ended, anyio.Event()
            if ended is not None:
                ended.set()

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``obstore.<name>_async(...)`` under asyncio; ``obstore.<name>(...)`` in a worker
        thread under trio (obstore's async functions need an asyncio loop)."""
        import obstore

        if self._loop is not None and self._loop.backend == "asyncio":
            return await getattr(obstore, f"{name}_async")(*args, **kwargs)
        call = functools.partial(getattr(obstore, name), *args, **kwargs)
        return await run_in_thread(call, abandon_on_cancel=True, needed=_ROLE)

    async def _read(self, key: str) -> bytes:
        import obstore

        if self._loop is not None and self._loop.backend == "asyncio":
            got = await obstore.get_async(self._store, key)
            return bytes(await got.bytes_async())
        read = lambda: bytes(obstore.get(self._store, key).bytes())  # noqa: E731
        return await run_in_thread(read, abandon_on_cancel=True, needed=_ROLE)

    async def _upload(self, key: str, source: PinnedFile, timestamp: Timestamp, seq: int) -> None:
        t0 = time.perf_counter()
        size = source.size
        try:
            try:
                for attempt in range(1, self.attempts + 1):
                    try:
                        await self._call(
                            "put", self._store, key, source.body(), chunk_size=self.part_size,
                            max_concurrency=self.part_concurrency,
                        )  # fmt: skip
                        break
                    except Exception as exc:
                        if attempt == self.attempts or not transient(exc):
                            raise
                        self._stats["retries"] += 1
                        await anyio.sleep(self.backoff * 2 ** (attempt - 1))
            finally:
                source.release()
            entry = {"key": key, "size": size, "timestamp": timestamp.state_dict()}
            await self._add(entry, seq)
            self._stats["uploaded"] += 1
            self._stats["bytes"] += size
            self._stats["seconds"] += time.perf_counter() - t0
        except Exception as exc:  # a cancellation (close's deadline) is reported by close
            exc.add_note(f"while CheckpointUploader uploaded {key!r} to {self.url!r}")
            with self._lock:
                if self._error is None:
                    self._error = exc

    async def _add(self, entry: dict[str, Any], seq: int) -> None:
        from obstore.exceptions import NotFoundError

        assert self._manifest_lock is not None
        async with self._manifest_lock:
            if self._entries is None:  # a resumed run continues the manifest it finds
                try:
                    data = await self._read(manifest_key(_rank()))
                    found = parse_manifest(data, f"{self.url}/{manifest_key(_rank())}")
                except (NotFoundError, FileNotFoundError):  # obstore raises either
                    found = []
                self._order = {e["key"]: i - len(found) for i, e in enumerate(found)}
                with self._lock:
                    self._entries = found
            self._order[entry["key"]] = seq
            entries = [e for e in self._entries if e["key"] != entry["key"]] + [entry]
            entries.sort(key=lambda e: self._order.get(e["key"], -1))
            keep = self.num_checkpoints_to_keep
            cut = len(entries) - keep if keep > 0 and len(entries) > keep else 0
            pruned, entries = entries[:cut], entries[cut:]
            body = json.dumps({"format": MANIFEST_FORMAT, "checkpoints": entries}).encode()
            await self._call("put", self._store, manifest_key(_rank()), body)
            with self._lock:
                self._entries = entries
            for old in pruned:  # after the manifest stopped naming them
                try:
                    await self._call("delete", self._store, old["key"])
                except (NotFoundError, FileNotFoundError):  # obstore raises either
                    pass
                self._stats["pruned"] += 1
