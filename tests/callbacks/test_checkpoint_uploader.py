"""CheckpointUploader against moto's S3 server: uploads, pruning, resume from s3://, retries."""

from __future__ import annotations

import json
import pathlib
import shutil
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers import TinyModel, make_loader
from tests.s3_server import DroppingProxy, moto_s3, s3_client
from trainbus import Callback, Trainer
from trainbus.callbacks import CheckpointSaver, CheckpointUploader

N_IN = 256  # a 256x256 layer: a 263 KB checkpoint


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3() as url:
        yield url


@pytest.fixture
def bucket(endpoint: str) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)  # type: ignore[attr-defined]
    return name


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> str:
    """The standard AWS variables pointing at the moto server."""
    for key, value in {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return endpoint


def objects(endpoint: str, bucket: str, prefix: str = "") -> dict[str, bytes]:
    client: Any = s3_client(endpoint)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def trainer(callbacks: list[Callback], epochs: int = 2, **kw: Any) -> Trainer:
    return Trainer(
        TinyModel(n_in=N_IN, n_out=N_IN), make_loader(3, n_in=N_IN), f"{epochs}ep",
        callbacks=callbacks, device="cpu", **kw,
    )  # fmt: skip


def test_every_checkpoint_is_uploaded_with_the_bytes_written(
    tmp_path: pathlib.Path, aws_env: str, bucket: str, no_leaked_threads: None
) -> None:
    saver = CheckpointSaver(
        tmp_path / "ckpt", filename="ep{epoch}/ba{batch}.pt", save_interval="1ba"
    )
    uploader = CheckpointUploader(saver, f"s3://{bucket}/run-1")
    trainer([saver, uploader]).fit_sync()
    got = objects(aws_env, bucket)
    names = ["ep0/ba1.pt", "ep0/ba2.pt", "ep0/ba3.pt", "ep1/ba4.pt", "ep1/ba5.pt", "ep1/ba6.pt"]
    for name in names:  # keys keep the path under the saver's folder
        assert got[f"run-1/{name}"] == (tmp_path / "ckpt" / name).read_bytes()
    manifest = json.loads(got["run-1/trainbus-manifest-rank0.json"])
    assert [e["key"] for e in manifest["checkpoints"]] == names
    assert [e["timestamp"]["batch"] for e in manifest["checkpoints"]] == [1, 2, 3, 4, 5, 6]
    assert [url for _, url in uploader.uploaded_checkpoints] == [
        f"s3://{bucket}/run-1/{n}" for n in names
    ]
    stats = uploader.statistics()
    assert (stats.handed_over, stats.uploaded, stats.pruned) == (6, 6, 0)
    assert stats.bytes_uploaded == sum(len(got[f"run-1/{n}"]) for n in names)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_uploads_run_on_the_fits_loop_under_either_backend(
    tmp_path: pathlib.Path, aws_env: str, bucket: str, no_leaked_threads: None, backend: str
) -> None:
    saver = CheckpointSaver(tmp_path / "ckpt", filename="ba{batch}.pt", save_interval="3ba")
    uploader = CheckpointUploader(saver, f"s3://{bucket}/{backend}", num_checkpoints_to_keep=1)
    threads: set[str] = set()

    class Threads(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            threads.update(t.name for t in threading.enumerate())

    trainer([saver, uploader, Threads()], epochs=3).fit_sync(backend=backend)
    got = objects(aws_env, bucket, f"{backend}/")  # pruned to 1: manifest put + delete ran
    assert sorted(got) == [f"{backend}/ba9.pt", f"{backend}/trainbus-manifest-rank0.json"]
    assert uploader.statistics().uploaded == 3
    assert "trainbus-checkpoint-uploader" not in threads  # no event loop of its own


def test_large_files_go_up_in_parts(tmp_path: pathlib.Path, aws_env: str, bucket: str) -> None:
    class Big(TinyModel):
        def __init__(self) -> None:
            super().__init__(n_in=N_IN, n_out=N_IN)
            self.register_buffer("blob", torch.randn(3 * 1024 * 1024))  # 12 MB

    saver = CheckpointSaver(tmp_path / "ckpt", filename="ba{batch}.pt", save_interval="3ba")
    uploader = CheckpointUploader(saver, f"s3://{bucket}/big", part_size=5 * 1024 * 1024)
    Trainer(Big(), make_loader(3, n_in=N_IN), "1ep", callbacks=[saver, uploader],
            device="cpu").fit_sync()  # fmt: skip
    client: Any = s3_client(aws_env)
    head = client.head_object(Bucket=bucket, Key="big/ba3.pt")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object of 3 parts
    assert head["ContentLength"] == (tmp_path / "ckpt" / "ba3.pt").stat().st_size


def test_remote_keeps_num_checkpoints_to_keep(
    tmp_path: pathlib.Path, aws_env: str, bucket: str
) -> None:
    saver = CheckpointSaver(tmp_path / "ckpt", filename="ba{batch}.pt", save_interval="1ba",
                            num_checkpoints_to_keep=2)  # fmt: skip
    uploader = CheckpointUploader(saver, f"s3://{bucket}/p")
    trainer([saver, uploader]).fit_sync()
    assert sorted(objects(aws_env, bucket)) == [
        "p/ba5.pt", "p/ba6.pt", "p/trainbus-manifest-rank0.json"
    ]  # fmt: skip
    assert uploader.statistics().pruned == 4
    # its own count: keep more remotely than on disk
    saver2 = CheckpointSaver(tmp_path / "c2", filename="ba{batch}.pt", save_interval="1ba",
                             num_checkpoints_to_keep=1)  # fmt: skip
    up2 = CheckpointUploader(saver2, f"s3://{bucket}/q", num_checkpoints_to_keep=3)
    trainer([saver2, up2]).fit_sync()
    assert sorted(objects(aws_env, bucket, "q/")) == [
        "q/ba4.pt",
        "q/ba5.pt",
        "q/ba6.pt",
        "q/trainbus-manifest-rank0.json",
    ]
    assert [p.name for p in (tmp_path / "c2").iterdir()] == ["ba6.pt"]


def test_resume_from_s3_continues_like_the_uninterrupted_run(
    tmp_path: pathlib.Path, aws_env: str, bucket: str
) -> None:
    full = trainer([], epochs=2)
    full.fit_sync()
    saver = CheckpointSaver(tmp_path / "a", save_interval="2ba", num_checkpoints_to_keep=2)
    first = trainer([saver, CheckpointUploader(saver, f"s3://{bucket}/job")], epochs=1)
    first.fit_sync()
    shutil.rmtree(tmp_path / "a")  # a new machine: only the bucket is left
    url = f"s3://{bucket}/job"
    saver_b = CheckpointSaver(tmp_path / "b", save_interval="2ba", num_checkpoints_to_keep=2)
    resumed = trainer([saver_b, CheckpointUploader(saver_b, url)], epochs=2, load_path=url)
    assert int(resumed.state.timer.batch) == 2  # the newest complete checkpoint: batch 2
    resumed.fit_sync()
    for a, b in zip(full.state.model.state_dict().values(),
                    resumed.state.model.state_dict().values(), strict=True):  # fmt: skip
        assert torch.equal(a, b)
    # the resumed run continued the manifest and pruned across both runs
    manifest = json.loads(objects(aws_env, bucket)["job/trainbus-manifest-rank0.json"])
    assert [e["timestamp"]["batch"] for e in manifest["checkpoints"]] == [4, 6]
    assert sorted(objects(aws_env, bucket, "job/ep")) == [
        "job/ep1-ba4-rank0.pt", "job/ep1-ba6-rank0.pt"
    ]  # fmt: skip


def test_load_path_s3_uses_the_uploaders_endpoint_and_credentials(
    tmp_path: pathlib.Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(key, raising=False)
    opts = {"endpoint_url": endpoint, "access_key_id": "k", "secret_access_key": "s"}
    url = f"s3://{bucket}/x"
    saver = CheckpointSaver(tmp_path / "a", save_interval="1ep")
    trainer([saver, CheckpointUploader(saver, url, **opts)], epochs=1).fit_sync()
    saver_b = CheckpointSaver(tmp_path / "b")
    again = trainer([saver_b, CheckpointUploader(saver_b, url, **opts)], epochs=2, load_path=url)
    assert int(again.state.timer.epoch) == 1


def test_an_empty_prefix_starts_fresh(tmp_path: pathlib.Path, aws_env: str, bucket: str) -> None:
    t = trainer([], load_path=f"s3://{bucket}/nothing-yet")
    assert int(t.state.timer.batch) == 0


def test_a_manifest_entry_whose_object_is_gone_is_skipped(
    tmp_path: pathlib.Path, aws_env: str, bucket: str
) -> None:
    saver = CheckpointSaver(tmp_path / "a", filename="ba{batch}.pt", save_interval="1ba")
    trainer([saver, CheckpointUploader(saver, f"s3://{bucket}/r")], epochs=1).fit_sync()
    client: Any = s3_client(aws_env)
    client.delete_object(Bucket=bucket, Key="r/ba3.pt")
    client.put_object(Bucket=bucket, Key="r/ba2.pt", Body=b"torn")  # not the recorded size
    t = trainer([], load_path=f"s3://{bucket}/r")
    assert int(t.state.timer.batch) == 1


def test_an_upload_cut_half_way_is_retried(
    tmp_path: pathlib.Path, endpoint: str, bucket: str, no_leaked_threads: None
) -> None:
    proxy = DroppingProxy(endpoint, min_body=100_000)
    try:
        saver = CheckpointSaver(tmp_path / "a", filename="ba{batch}.pt", save_interval="3ba")
        uploader = CheckpointUploader(
            saver, f"s3://{bucket}/cut", endpoint_url=proxy.endpoint,
            access_key_id="testing", secret_access_key="testing", backoff=0.0,
        )  # fmt: skip
        trainer([saver, uploader], epochs=1).fit_sync()
    finally:
        proxy.close()
    assert proxy.dropped == 1 and proxy.dropped_event.is_set()
    assert proxy.connections >= 2  # the cut request was sent again on a new connection
    assert objects(endpoint, bucket, "cut/ba")["cut/ba3.pt"] == (tmp_path / "a/ba3.pt").read_bytes()
    assert uploader.statistics().uploaded == 1


def test_a_checkpoint_pruned_locally_before_its_upload_is_still_uploaded(
    tmp_path: pathlib.Path, endpoint: str, bucket: str, no_leaked_threads: None
) -> None:
    gate = threading.Event()
    proxy = DroppingProxy(endpoint, min_body=100_000, gate=gate)
    written: dict[int, bytes] = {}
    folder = tmp_path / "a"

    def watch(timestamp: Any, path: pathlib.Path) -> None:  # on the writer, before the upload
        written[int(timestamp.batch)] = path.read_bytes()
        if int(timestamp.batch) == 3:  # ba1.pt was pruned when ba2.pt was complete
            assert not (folder / "ba1.pt").exists()
            gate.set()

    try:
        saver = CheckpointSaver(folder, filename="ba{batch}.pt", save_interval="1ba",
                                num_checkpoints_to_keep=1)  # fmt: skip
        saver.add_listener(watch)
        uploader = CheckpointUploader(
            saver, f"s3://{bucket}/pruned", endpoint_url=proxy.endpoint, access_key_id="t",
            secret_access_key="t", num_checkpoints_to_keep=-1,
        )  # fmt: skip
        trainer([saver, uploader], epochs=1).fit_sync()
    finally:
        gate.set()
        proxy.close()
    got = objects(endpoint, bucket, "pruned/ba")
    assert {k: got[f"pruned/ba{k}.pt"] for k in (1, 2, 3)} == written
    assert [p.name for p in folder.iterdir()] == ["ba3.pt"]  # the hidden links are gone


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_uploads_unfinished_at_close_timeout_are_cancelled_and_reported(
    tmp_path: pathlib.Path, endpoint: str, bucket: str, no_leaked_threads: None, backend: str
) -> None:
    gate = threading.Event()  # never opened while the run closes: the upload hangs
    proxy = DroppingProxy(endpoint, min_body=100_000, gate=gate)
    try:
        saver = CheckpointSaver(tmp_path / "a", filename="ba{batch}.pt", save_interval="3ba")
        uploader = CheckpointUploader(
            saver, f"s3://{bucket}/stuck", endpoint_url=proxy.endpoint, access_key_id="t",
            secret_access_key="t", close_timeout=0.5,
        )  # fmt: skip
        with pytest.raises(TimeoutError, match=r"1 upload\(s\) .* close_timeout=0.5 s"):
            trainer([saver, uploader], epochs=1).fit_sync(backend=backend)
    finally:
        gate.set()
        proxy.close()
    assert not [p for p in (tmp_path / "a").iterdir() if ".upload-" in p.name]


def test_an_upload_that_keeps_failing_is_raised_from_fit(
    tmp_path: pathlib.Path, aws_env: str, no_leaked_threads: None
) -> None:
    saver = CheckpointSaver(tmp_path / "a", save_interval="1ep")
    uploader = CheckpointUploader(saver, "s3://no-such-bucket/x", backoff=0.0, max_retries=0)
    with pytest.raises(Exception, match=r"no-such-bucket|NoSuchBucket|not found") as info:
        trainer([saver, uploader], epochs=1).fit_sync()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "while CheckpointUploader uploaded 'ep1-ba3-rank0.pt'" in notes


def test_the_saver_must_be_in_the_run(tmp_path: pathlib.Path, aws_env: str, bucket: str) -> None:
    saver = CheckpointSaver(tmp_path / "a")
    with pytest.raises(ValueError, match=r"callbacks=\[saver, uploader\]"):
        trainer([CheckpointUploader(saver, f"s3://{bucket}/x")], epochs=1).fit_sync()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"url": "bucket/prefix"}, r"url='bucket/prefix' must be an S3 URL, e.g. 's3://"),
        ({"url": "s3:///prefix"}, "has no bucket"),
        ({"max_in_flight": 0}, r"max_in_flight=0 must be a positive int"),
        ({"part_size": 1024}, "at least 5 MiB"),
        ({"num_checkpoints_to_keep": 0}, "num_checkpoints_to_keep=0 must be -1"),
        ({"attempts": 0}, "attempts=0 must be a positive int"),
        ({"close_timeout": 0}, r"close_timeout=0 must be seconds > 0"),
        ({"max_retries": -1}, r"max_retries=-1 must be an int >= 0"),
        ({"backoff": -1.0}, r"backoff=-1.0 must be seconds >= 0"),
    ],
)
def test_bad_arguments_name_the_argument(
    tmp_path: pathlib.Path, kwargs: dict[str, Any], match: str
) -> None:
    saver = CheckpointSaver(tmp_path)
    args: dict[str, Any] = {"url": "s3://b/p", **kwargs}
    with pytest.raises(ValueError, match=match):
        CheckpointUploader(saver, **args)


def test_the_saver_argument_is_checked() -> None:
    with pytest.raises(TypeError, match=r"must be a trainbus\.callbacks\.CheckpointSaver"):
        CheckpointUploader("ckpt", "s3://b/p")  # type: ignore[arg-type]
