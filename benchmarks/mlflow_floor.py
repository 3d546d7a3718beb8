"""``bench_mlflow_windows.py``'s ``floor`` variant: logging to MLflow with no trainbus at all.

The hand-written loop computes the same 10 values per batch; each "on" batch appends its 10
points (dicts) to a list, and every 1,000 points or 1 s the list is handed with
``call_soon_threadsafe`` to one task on an asyncio loop in a second thread, which
``json.dumps`` it and POSTs it with httpx to ``runs/log-batch`` (MLflow's REST API): the least
a logger that sends from an event loop in the training process does. Whatever it costs the
training thread, no such logger in this process can cost less.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import httpx
import mlflow_points as mp


def train_floor(w: Any, on: bytearray, url: str, clocks: tuple[str, ...]) -> dict[str, Any]:
    """One fit of the floor over ``len(on)`` batches (logging where ``on``): the marks
    per batch in ``clocks`` (``bench_mlflow_windows.train``'s), the ms from the last batch
    to every point sent, and the MLflow run's id."""
    api = f"{url.rstrip('/')}/api/2.0/mlflow"
    with httpx.Client() as client:
        experiment = client.post(f"{api}/experiments/create",
                                 json={"name": f"floor-{uuid.uuid4().hex[:6]}"})
        experiment.raise_for_status()
        created = client.post(f"{api}/runs/create", json={
            "experiment_id": experiment.json().get("experiment_id"),  # the stub has none
            "start_time": int(time.time() * 1e3)})
        created.raise_for_status()
    run_id = created.json()["run"]["info"]["run_id"]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    box: dict[str, Any] = {}

    async def open_client() -> None:
        box["client"] = httpx.AsyncClient(timeout=30.0)
        box["queue"] = asyncio.Queue()
        box["worker"] = asyncio.get_running_loop().create_task(send_all())

    async def send_all() -> None:
        while True:
            points = await box["queue"].get()
            if points is None:
                return
            body = json.dumps({"run_id": run_id, "metrics": points})
            response = await box["client"].post(
                f"{api}/runs/log-batch", content=body,
                headers={"Content-Type": "application/json"})
            response.raise_for_status()

    asyncio.run_coroutine_threadsafe(open_client(), loop).result()
    n = len(on)
    marks = {clock: [0.0] * n for clock in clocks}
    model, loss_fn, opt = w.model, w.loss_fn, w.optimizer()
    batches = (w.batches * (n // len(w.batches) + 1))[:n]
    points: list[dict[str, Any]] = []
    sent_at = time.perf_counter()
    put = box["queue"].put_nowait
    try:
        for i, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            metrics = mp.values(i + 1)
            if on[i]:
                stamp = int(time.time() * 1e3)
                points += [{"key": k, "value": v, "timestamp": stamp, "step": i + 1}
                           for k, v in metrics.items()]
                now = time.perf_counter()
                if len(points) >= 1000 or now - sent_at >= 1.0:
                    loop.call_soon_threadsafe(put, points)
                    points, sent_at = [], now
            marks["wall"][i] = time.perf_counter()
            marks["cpu"][i] = time.thread_time()
            marks["proc"][i] = time.process_time()
        if points:
            loop.call_soon_threadsafe(put, points)
        loop.call_soon_threadsafe(put, None)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(box["worker"], 300), loop).result()
    finally:
        asyncio.run_coroutine_threadsafe(box["client"].aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    ended = time.perf_counter()
    return {"marks": marks, "fit_ms": (ended - marks["wall"][-1]) * 1e3, "run_id": run_id}

