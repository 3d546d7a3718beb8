"""Which async S3 client uploads a checkpoint file fastest, and with the least CPU.

Uploads one ``--mb`` (200) MB file of random bytes to a moto S3 server (``python -m
moto.server`` in a subprocess, so this process's CPU time is the client's alone) with:

    obstore      ``obstore.put_async(S3Store, key, open(file))``: multipart, 8 MB parts,
                 up to 8 parts in flight (Rust, GIL released)
    aiobotocore  ``create_multipart_upload`` / ``upload_part`` (8 MB parts read from the
                 file, up to 8 in flight under a semaphore) / ``complete_multipart_upload``

Rounds interleaved (each round runs both, in a rotated order). Reported per client: wall
seconds, MB/s and client CPU seconds (``time.process_time`` of this process), median
[min-max]. The moto server (Python, one process) is the bottleneck of the wall time on a
small machine; the client CPU is what the uploader takes away from training.

Run:  python benchmarks/bench_s3_clients.py [--mb 200] [--rounds 3]   (about 1-2 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PART = 8 * 1024 * 1024
CONCURRENCY = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str) -> None:
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


async def _obstore(endpoint: str, path: str, key: str) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        "bench", endpoint=endpoint, region="us-east-1", access_key_id="x",
        secret_access_key="x", client_options={"allow_http": True},
    )  # fmt: skip
    with open(path, "rb") as f:
        await obstore.put_async(store, key, f, chunk_size=PART, max_concurrency=CONCURRENCY)


async def _aiobotocore(endpoint: str, path: str, key: str) -> None:
    from aiobotocore.session import get_session

    session = get_session()
    async with session.create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
        aws_secret_access_key="x",
    ) as client:  # fmt: skip
        up = await client.create_multipart_upload(Bucket="bench", Key=key)
        size = os.path.getsize(path)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def part(n: int, offset: int) -> dict[str, object]:
            async with sem:
                with open(path, "rb") as f:
                    f.seek(offset)
                    body = f.read(PART)
                r = await client.upload_part(
                    Bucket="bench", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=body
                )
                return {"PartNumber": n, "ETag": r["ETag"]}

        parts = await asyncio.gather(
            *(part(i + 1, off) for i, off in enumerate(range(0, size, PART)))
        )
        await client.complete_multipart_upload(
            Bucket="bench", Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_up(endpoint)
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
            aws_secret_access_key="x",
        )  # fmt: skip
        s3.create_bucket(Bucket="bench")
        with tempfile.NamedTemporaryFile(delete=False) as f:
            f.write(os.urandom(args.mb * 1024 * 1024))
            path = f.name
        clients = {"obstore": _obstore, "aiobotocore": _aiobotocore}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        names = list(clients)
        for r in range(args.rounds):
            for name in names[r % 2 :] + names[: r % 2]:
                c0, t0 = time.process_time(), time.perf_counter()
                asyncio.run(clients[name](endpoint, path, f"{name}-{r}"))
                results[name].append((time.perf_counter() - t0, time.process_time() - c0))
                s3.delete_object(Bucket="bench", Key=f"{name}-{r}")
        os.unlink(path)
        print(f"{args.mb} MB, {PART >> 20} MB parts, {CONCURRENCY} in flight, {args.rounds} rounds")
        print("| client | wall s | MB/s | client CPU s |\n|---|---|---|---|")
        for name, rows in results.items():
            walls, cpus = [w for w, _ in rows], [c for _, c in rows]
            mbs = [args.mb / w for w in walls]

            def fmt(xs: list[float], p: int = 2) -> str:
                return f"{statistics.median(xs):.{p}f} [{min(xs):.{p}f}-{max(xs):.{p}f}]"

            print(f"| {name} | {fmt(walls)} | {fmt(mbs, 0)} | {fmt(cpus)} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
