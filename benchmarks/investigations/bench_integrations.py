"""What the bridge costs per batch under each host: own loop, Lightning, Hugging Face (issue 33).

    python benchmarks/investigations/bench_integrations.py [--rounds 5] [--batches 200]
        [--hosts own,lightning,hf] [--json out.json]

The workload is the suite's ``mlp`` (Linear 256->512, ReLU, Linear 512->10, batch 64, SGD,
one torch thread, batches made once with a fixed seed and kept in memory). Each host runs
four arms, interleaved in every round (the arm order rotates from round to round):

- ``native``: the host alone (own loop: a plain PyTorch loop; Lightning's and HF's
  ``Trainer`` with no callback but the timer);
- ``native+10``: the host with 10 no-op callbacks of its own kind on the hooks the bridge
  uses (own loop: 10 objects whose 12 per-batch methods it calls directly; Lightning:
  ``on_train_batch_start``, ``on_before_backward``, ``on_after_backward``,
  ``on_before_optimizer_step``, ``on_train_batch_end``; HF: ``on_step_begin``,
  ``on_pre_optimizer_step``, ``on_step_end``);
- ``bus``: the host with the bridge and no trainbus callback (own loop: ``trainbus.Bus``
  with ``bus.batch()`` and the 7 inner events published, 12 per batch as the trainer's;
  Lightning/HF: ``TrainbusCallback`` started with ``fit_sync``/``train_sync``);
- ``bus+10``: the bridge with 10 trainbus callbacks whose 12 per-batch handlers are
  plain no-op methods.

The figures are the host's training loop time per batch (own loop: ``train()``;
Lightning: ``on_train_start`` to ``on_train_end``; HF: ``on_train_begin`` to
``on_train_end``), so each framework's start-up is left out: wall-clock, and the process's
CPU time over the same span (every thread: the training thread, the event loop, the
lanes), which moves less than wall time when neighbours load the machine. The bridge's cost per batch is the median over
rounds of the paired differences ``bus - native`` and ``bus+10 - native+10``. On a
shared 2-core machine differences under about 0.5 ms a batch are within the noise
(SPEC section 7); the printout gives each arm's spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import trainbus
from trainbus import Event

E = Event
PER_BATCH = (
    "after_dataloader", "batch_start", "before_train_batch", "before_forward",
    "after_forward", "before_loss", "after_loss", "before_backward",
    "after_backward", "after_train_batch", "batch_end", "batch_checkpoint",
)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def make_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(n)]


def noop(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


#: A trainbus callback with a plain no-op handler for every per-batch event.
NoopCallback = type("NoopCallback", (trainbus.Callback,), {name: noop for name in PER_BATCH})
#: The own loop's native callbacks: objects whose per-batch methods it calls directly.
PlainHooks = type("PlainHooks", (), {name: noop for name in PER_BATCH})


# -- own loop -------------------------------------------------------------------------------


def own(arm: str, batches: list[Any]) -> tuple[float, float]:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if arm.startswith("native"):
        hooks = [PlainHooks() for _ in range(10 if arm.endswith("+10") else 0)]
        calls = [[getattr(h, name) for h in hooks] for name in PER_BATCH]

        def point(i: int) -> None:
            for call in calls[i]:
                call()

        started, cpu = time.perf_counter(), time.process_time()
        for x, y in batches:
            for i in range(3):
                point(i)
            opt.zero_grad()
            point(3)
            out = model(x)
            point(4)
            point(5)
            loss = F.cross_entropy(out, y)
            point(6)
            point(7)
            loss.backward()
            point(8)
            point(9)
            opt.step()
            point(10)
            point(11)
        return time.perf_counter() - started, time.process_time() - cpu

    callbacks = [NoopCallback() for _ in range(10 if arm.endswith("+10") else 0)]
    bus = trainbus.Bus(callbacks=callbacks, model=model, optimizers=opt)
    box: list[tuple[float, float]] = []

    def train() -> None:
        started, cpu = time.perf_counter(), time.process_time()
        state, publish = bus.state, bus.publish
        for x, y in batches:
            with bus.batch((x, y), samples=64):
                opt.zero_grad()
                publish(E.BEFORE_FORWARD)
                out = model(x)
                state.outputs = out
                publish(E.AFTER_FORWARD, E.BEFORE_LOSS)
                loss = F.cross_entropy(out, y)
                state.loss = loss.detach()
                publish(E.AFTER_LOSS, E.BEFORE_BACKWARD)
                loss.backward()
                publish(E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH)
                opt.step()
        box.append((time.perf_counter() - started, time.process_time() - cpu))

    bus.run_sync(train)
    return box[0]


# -- Lightning ------------------------------------------------------------------------------


def lightning(arm: str, batches: list[Any]) -> tuple[float, float]:
    import pytorch_lightning as pl

    from trainbus.integrations.lightning import TrainbusCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return F.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    hooks = ("on_train_batch_start", "on_before_backward", "on_after_backward",
             "on_before_optimizer_step", "on_train_batch_end")
    Noop = type("Noop", (pl.Callback,), {h: noop for h in hooks})

    class Timer(pl.Callback):  # type: ignore[misc]
        elapsed = (0.0, 0.0)

        def on_train_start(self, *a: Any) -> None:
            self.started = (time.perf_counter(), time.process_time())

        def on_train_end(self, *a: Any) -> None:
            wall, cpu = self.started
            self.elapsed = (time.perf_counter() - wall, time.process_time() - cpu)

    class Loader:  # the batches as they are (a list would be read as several loaders)
        def __iter__(self) -> Any:
            return iter(batches)

        def __len__(self) -> int:
            return len(batches)

    timer = Timer()
    n = 10 if arm.endswith("+10") else 0
    bridge = None
    if arm.startswith("native"):
        callbacks: list[Any] = [Noop() for _ in range(n)]
    else:
        bridge = TrainbusCallback(callbacks=[NoopCallback() for _ in range(n)])
        callbacks = [bridge]
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[*callbacks, timer], logger=False, accelerator="cpu",
        devices=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    if bridge is None:
        trainer.fit(Module(), Loader())
    else:
        bridge.fit_sync(trainer, Module(), Loader())
    return timer.elapsed


# -- Hugging Face ---------------------------------------------------------------------------


def hf(arm: str, batches: list[Any]) -> tuple[float, float]:
    import transformers

    from trainbus.integrations.hf import TrainbusCallback

    class Config(transformers.PretrainedConfig):  # type: ignore[misc]
        model_type = "bench-mlp"

    class Model(transformers.PreTrainedModel):  # type: ignore[misc]
        config_class = Config

        def __init__(self, config: Config) -> None:
            super().__init__(config)
            self.net = make_model()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
            logits = self.net(x)
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}

    rows = [{"x": x[i], "labels": y[i]} for x, y in batches for i in range(len(x))]
    hooks = ("on_step_begin", "on_pre_optimizer_step", "on_step_end")
    Noop = type("Noop", (transformers.TrainerCallback,), {h: noop for h in hooks})

    class Timer(transformers.TrainerCallback):  # type: ignore[misc]
        elapsed = (0.0, 0.0)

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.started = (time.perf_counter(), time.process_time())

        def on_train_end(self, *a: Any, **k: Any) -> None:
            wall, cpu = self.started
            self.elapsed = (time.perf_counter() - wall, time.process_time() - cpu)

    timer = Timer()
    n = 10 if arm.endswith("+10") else 0
    bridge = None
    if arm.startswith("native"):
        callbacks: list[Any] = [Noop() for _ in range(n)]
    else:
        bridge = TrainbusCallback(callbacks=[NoopCallback() for _ in range(n)])
        callbacks = [bridge]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, num_train_epochs=1, per_device_train_batch_size=64,
            learning_rate=0.01, logging_steps=10**6, save_strategy="no", report_to="none",
            use_cpu=True, disable_tqdm=True, log_level="error", dataloader_num_workers=0,
        )
        trainer = transformers.Trainer(model=Model(Config()), args=args, train_dataset=rows,
                                       callbacks=[*callbacks, timer])
        trainer.remove_callback(transformers.PrinterCallback)  # the summary's print
        if bridge is None:
            trainer.train()
        else:
            bridge.train_sync(trainer)
    return timer.elapsed


HOSTS: dict[str, Callable[[str, list[Any]], tuple[float, float]]] = {
    "own": own, "lightning": lightning, "hf": hf,
}
ARMS = ("native", "bus", "native+10", "bus+10")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--hosts", default="own,lightning,hf")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # the hosts' advice (workers, deprecations)
    import logging

    logging.disable(logging.WARNING)  # Lightning's and HF's start-up banners
    batches = make_batches(opts.batches)
    hosts = opts.hosts.split(",")
    kinds = ("wall", "cpu")
    results = {k: {h: {a: [] for a in ARMS} for h in hosts} for k in kinds}
    for host in hosts:
        HOSTS[host]("native", batches[:8])  # warm-up: imports, first torch calls
        HOSTS[host]("bus", batches[:8])
    for r in range(opts.rounds):
        for host in hosts:
            for arm in ARMS[r % len(ARMS):] + ARMS[: r % len(ARMS)]:
                wall, cpu = HOSTS[host](arm, batches)
                results["wall"][host][arm].append(wall / opts.batches * 1e3)
                results["cpu"][host][arm].append(cpu / opts.batches * 1e3)
        print(f"round {r + 1}/{opts.rounds} done", file=sys.stderr)

    for kind, what in (("wall", "wall-clock"), ("cpu", "process CPU time (all threads)")):
        print(f"\n{what}, ms per batch, median [min-max] of {opts.rounds} interleaved "
              f"rounds, {opts.batches} batches of the mlp workload, one torch thread")
        print(f"{'host':<10}" + "".join(f"{a:>23}" for a in ARMS)
              + f"{'bridge, 0 cb':>16}{'bridge, 10 cb':>16}")
        for host in hosts:
            res = results[kind][host]
            cells = "".join(
                f"{statistics.median(res[a]):>9.3f} [{min(res[a]):.3f}-{max(res[a]):.3f}]"
                for a in ARMS
            )
            d0 = statistics.median(
                b - n for b, n in zip(res["bus"], res["native"], strict=True)
            )
            d10 = statistics.median(
                b - n for b, n in zip(res["bus+10"], res["native+10"], strict=True)
            )
            print(f"{host:<10}{cells}{d0:>+16.3f}{d10:>+16.3f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"batches": opts.batches, "rounds": opts.rounds, "ms_per_batch": results},
                      f, indent=1)


if __name__ == "__main__":
    main()
