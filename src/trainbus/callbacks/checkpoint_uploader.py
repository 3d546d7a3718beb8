"""``CheckpointUploader``: each checkpoint a saver completes, uploaded to S3 while training goes on.

The saver's writer thread hands over each file once it is complete on disk
(:meth:`CheckpointSaver.add_listener`); the uploader pins it there with a hidden hard
link (so the saver may prune the local file at once) and schedules its upload on the
uploader's own asyncio event loop, which runs in a thread started at the first hand-off
and joined at ``close``. Uploads use
``obstore`` (Rust; multipart for files larger than ``part_size``, ``part_concurrency``
parts in flight; the GIL is released while bytes move). At most ``max_in_flight`` uploads
are unfinished: a further hand-off waits, which holds the saver's writer, so the next save
waits too (no checkpoint is skipped, memory and disk stay bounded). How a checkpoint
becomes complete remotely, and how resuming finds it: :mod:`trainbus.checkpoint.s3`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import pathlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from trainbus.core.callback import Callback, blocking
from trainbus.core.timer import Timestamp

if TYPE_CHECKING:
    from trainbus.core.logger import Logger
    from trainbus.core.state import State

__all__ = ["CheckpointUploader", "UploaderStatistics"]

_MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class UploaderStatistics:
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


def _positive_int(value: Any, name: str, example: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = "a positive int" if low else "an int >= 0"
        raise ValueError(f"{name}={value!r} must be {what}, e.g. {example}")
    return value


async def _settle() -> None:
    """Wait until every other task of the uploader's loop has ended (cancelled ones too)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*tasks, return_exceptions=True)


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._futures: list[concurrent.futures.Future[None]] = []
        self._error: BaseException | None = None
        self._entries: list[dict[str, Any]] | None = None  # the manifest; loop thread only
        self._order: dict[str, int] = {}
        self._seq = 0
        self._manifest_lock: asyncio.Lock | None = None
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

    def statistics(self) -> UploaderStatistics:
        """Counts and times of the uploads so far (see :class:`UploaderStatistics`)."""
        s = self._stats
        return UploaderStatistics(
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

    def close(self, state: State, logger: Logger) -> None:
        """Wait for the saver's last write and every upload; raise an error not yet raised.

        Uploads unfinished after ``close_timeout`` are cancelled (the manifest names only
        complete checkpoints) and reported with a ``TimeoutError``.
        """
        deadline = time.monotonic() + self.close_timeout
        self.saver.wait_written(self.close_timeout)
        self.saver.remove_listener(self._hand_over)
        with self._lock:
            futures, self._futures = self._futures, []
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        left = max(0.0, deadline - time.monotonic())
        _, pending = concurrent.futures.wait(futures, timeout=left)
        for future in pending:
            future.cancel()
        if loop is not None and thread is not None:
            asyncio.run_coroutine_threadsafe(_settle(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        if pending:
            error = TimeoutError(
                f"CheckpointUploader: {len(pending)} upload(s) to {self.url!r} did not finish "
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
            with self._lock:
                self._stats["handed"] += 1
                seq, self._seq = self._seq, self._seq + 1
                loop = self._loop or self._start()
                job = self._upload(key, source, timestamp, seq)
                future = asyncio.run_coroutine_threadsafe(job, loop)
                self._futures = [f for f in self._futures if not f.done()] + [future]
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop, self._thread = (
            loop,
            threading.Thread(target=run, name="trainbus-checkpoint-uploader", daemon=True),
        )
        self._thread.start()
        return loop

    # -- the uploader's event loop -----------------------------------------------------------

    async def _upload(self, key: str, source: PinnedFile, timestamp: Timestamp, seq: int) -> None:
        import obstore

        t0 = time.perf_counter()
        size = source.size
        try:
            try:
                for attempt in range(1, self.attempts + 1):
                    try:
                        await obstore.put_async(
                            self._store, key, source.body(), chunk_size=self.part_size,
                            max_concurrency=self.part_concurrency,
                        )  # fmt: skip
                        break
                    except Exception as exc:
                        if attempt == self.attempts or not transient(exc):
                            raise
                        self._stats["retries"] += 1
                        await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
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
        import obstore
        from obstore.exceptions import NotFoundError

        if self._manifest_lock is None:
            self._manifest_lock = asyncio.Lock()
        async with self._manifest_lock:
            if self._entries is None:  # a resumed run continues the manifest it finds
                try:
                    got = await obstore.get_async(self._store, manifest_key(_rank()))
                    data = bytes(await got.bytes_async())
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
            await obstore.put_async(self._store, manifest_key(_rank()), body)
            with self._lock:
                self._entries = entries
            for old in pruned:  # after the manifest stopped naming them
                try:
                    await obstore.delete_async(self._store, old["key"])
                except (NotFoundError, FileNotFoundError):  # obstore raises either
                    pass
                self._stats["pruned"] += 1
