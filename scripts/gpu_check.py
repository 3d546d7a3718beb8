"""GPU check (SPEC D14): no host-device sync from the bus, and the step-time cost of callbacks.

On a CUDA machine it

1. arms ``torch.cuda.set_sync_debug_mode("error")`` and proves the check is armed on
   trainbus's training thread: a control callback that calls ``loss.item()`` there must
   make ``fit()`` fail;
2. trains with each built-in logging callback alone (whichever of SpeedMonitor,
   LRMonitor, MemoryMonitor, GradMonitor, ProgressBar, InMemoryLogger, JSONLinesLogger
   exist), with evaluation, under that mode, and reports PASS or the sync it hit;
   It also fits with the default output (a progress bar, the time account's ``time/...``
   metrics and its end-of-fit table) under that mode: no sync, and on CUDA the account's
   ``device_compute`` comes from CUDA events;
3. checks the fp16 step (issue 14): with ``precision="fp16"`` and ``grad_clip_norm``, the
   gradients at ``AFTER_TRAIN_BATCH`` are those of ``AFTER_BACKWARD`` divided by the
   grad scaler's scale (then clipped), finite, and applied by ``BATCH_END``; no sync
   check here (``GradScaler.step`` reads ``found_inf`` on the host, as in plain AMP);
4. times a plain PyTorch loop, trainbus with no callbacks, and trainbus with every
   callback that passed, interleaved over ``--rounds`` rounds, and prints the median
   ms/step of each and the ratios. Step times come from CUDA events recorded as each
   batch is fetched (no sync while training), so host-side stalls show up as gaps.

Usage::

    python scripts/gpu_check.py                 # on a CUDA machine (about a minute)
    python scripts/gpu_check.py --cpu --steps 5 # a dry run of the same code on the CPU
    python scripts/gpu_check.py --ddp           # DDP and FSDP under torchrun (1+ GPUs)
    python scripts/gpu_check.py --ddp --cpu     # the same with gloo on the CPU

Without CUDA (and without ``--cpu``) it says so and exits 0. Exit status 1 means a
callback (or the bus) synchronised with the device, or the control did not trip.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import trainbus
from trainbus import Callback, Trainer, blocking
from trainbus.loggers import InMemoryLogger

__all__ = ["main"]


class MLP(torch.nn.Module):
    """A Composer-style MLP: ``forward(batch)`` and ``loss(outputs, batch)``."""

    def __init__(self, width: int, depth: int = 4, n_in: int = 256, n_out: int = 10) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(n_in, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, n_out))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = self.net(batch[0])
        return out

    def loss(self, outputs: torch.Tensor, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(outputs, batch[1])


class StepClock:
    """A loader that marks the time each batch is fetched: CUDA events, or perf_counter."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        self.batches = batches
        self.steps = steps
        self.cuda = batches[0][0].device.type == "cuda"
        self.marks: list[Any] = []

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(self.steps):
            self.marks.append(self._mark())
            yield self.batches[i % len(self.batches)]

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()  # on the fetching thread's current stream; no sync
            return event
        return time.perf_counter()

    def step_ms(self, skip: int) -> list[float]:
        """Milliseconds between consecutive fetches, after the first ``skip`` steps.

        Call after the device finished (``torch.cuda.synchronize()``).
        """
        marks = self.marks[skip:]
        if self.cuda:
            return [float(a.elapsed_time(b)) for a, b in itertools.pairwise(marks)]
        return [(b - a) * 1e3 for a, b in itertools.pairwise(marks)]


@contextlib.contextmanager
def sync_debug(mode: str, enabled: bool) -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode(mode)`` for the block (process-wide), then off."""
    if not enabled:
        yield
        return
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class ModeProbe(Callback):
    """Reads the sync debug mode on the training thread (a blocking handler runs there)."""

    def __init__(self) -> None:
        self.mode: int | None = None

    @blocking
    def fit_start(self, state: Any, logger: Any) -> None:
        if state.device.type == "cuda":
            self.mode = torch.cuda.get_sync_debug_mode()


class StepProbe(Callback):
    """Copies gradients and parameters at the step's events, in lockstep (fp16 check)."""

    def __init__(self) -> None:
        self.rows: list[tuple[trainbus.Event, float, list[Any], list[torch.Tensor]]] = []

    @blocking
    def run_event(self, event: trainbus.Event, state: Any, logger: Any) -> None:
        E = trainbus.Event
        if event in (E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH, E.BATCH_END):
            params = list(state.model.parameters())
            grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
            scale = state.scaler.get_scale() if state.scaler is not None else float("nan")
            self.rows.append((event, scale, grads, [p.detach().clone() for p in params]))


class ItemCaller(Callback):
    """The control: asks for a value on the training thread, which syncs."""

    @blocking
    def after_loss(self, state: Any, logger: Any) -> None:
        state.loss.item()


def _factory(cls: type[Callback], kwargs: dict[str, Any]) -> Callable[[], Callback]:
    return lambda: cls(**kwargs)


def builtin_callbacks(tmp: Path) -> list[tuple[str, Callable[[], Callback], bool]]:
    """``(name, factory, is_logger)`` for each built-in logging callback that exists."""
    found: list[tuple[str, Callable[[], Callback], bool]] = []
    callbacks: list[tuple[str, str, dict[str, Any]]] = [
        ("speed_monitor", "SpeedMonitor", {"window_size": 20}),
        ("lr_monitor", "LRMonitor", {}),
        ("memory_monitor", "MemoryMonitor", {"interval": "10ba"}),
        ("grad_monitor", "GradMonitor", {"log_layer_grad_norms": True}),
    ]
    loggers: list[tuple[str, str, dict[str, Any]]] = [
        ("callbacks.progress_bar", "ProgressBar", {"bar": "plain", "stream": io.StringIO()}),
        ("loggers.in_memory", "InMemoryLogger", {}),
        ("loggers.jsonl", "JSONLinesLogger", {"path": tmp / "metrics.jsonl"}),
    ]  # fmt: skip
    for module, name, kwargs in [(f"callbacks.{m}", n, k) for m, n, k in callbacks] + loggers:
        try:
            mod = __import__(f"trainbus.{module}", fromlist=[name])
            cls = getattr(mod, name)
        except (ImportError, AttributeError):
            print(f"  ({name} not available in this build: skipped)")
            continue
        is_logger = isinstance(cls, type) and issubclass(cls, trainbus.LoggerDestination)
        found.append((name, _factory(cls, kwargs), is_logger))
    return found


class Bench:
    """Builds models, data and trainers for one device and size."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args = args
        self.device = device
        g = torch.Generator().manual_seed(0)
        self.batches = [
            (
                torch.randn(args.batch_size, 256, generator=g).to(device),
                torch.randint(0, 10, (args.batch_size,), generator=g).to(device),
            )
            for _ in range(8)
        ]
        self.eval_batches = self.batches[:2]

    def model(self) -> MLP:
        torch.manual_seed(0)
        return MLP(self.args.width).to(self.device)

    def plain(self, steps: int) -> StepClock:
        model = self.model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        clock = StepClock(self.batches, steps)
        for batch in clock:  # never armed: the sync check is about trainbus
            loss = model.loss(model(batch), batch)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            opt.zero_grad(set_to_none=True)
        return clock

    def trainbus(
        self,
        steps: int,
        callbacks: Sequence[Callback] = (),
        loggers: Sequence[Any] = (),
        *,
        arm: bool = False,
    ) -> StepClock:
        """Train ``steps`` steps; with ``arm``, under ``set_sync_debug_mode("error")`` from
        ``fit()`` on (the model and data reach the device before, outside the check)."""
        model = self.model()
        clock = StepClock(self.batches, steps)
        trainer = Trainer(
            model,
            clock,
            f"{steps}ba",
            eval_dataloader=self.eval_batches,
            optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
            callbacks=list(callbacks),
            loggers=list(loggers),
            device=self.device,
            warn_slow_callbacks=False,
            progress=False,  # the default output is checked alone (check_account)
        )
        with sync_debug("error", arm):
            trainer.fit_sync()
        return clock


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    notes = getattr(exc, "__notes__", [])
    return (text[0] if text else type(exc).__name__) + (f" [{notes[0]}]" if notes else "")


def _synchronize(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def check_syncs(bench: Bench, cuda: bool, tmp: Path) -> tuple[bool, list[tuple[str, Any, bool]]]:
    """Steps 1 and 2: the control trips, then each callback alone; returns the passers."""
    ok = True
    steps = bench.args.check_steps
    if cuda:
        probe = ModeProbe()
        tripped = False
        try:
            bench.trainbus(steps, [probe, ItemCaller()], arm=True)
        except Exception as exc:  # the RuntimeError, with a note naming the handler
            tripped = "synchroniz" in repr(exc).lower()
            print(f"  control (loss.item() on the training thread): {_first_line(exc)}")
        _synchronize(cuda)
        print(f"  sync debug mode on the training thread: {probe.mode} (2 = error)")
        print(f"  control tripped as expected: {'yes' if tripped else 'NO'}")
        ok = ok and tripped and probe.mode == 2
        try:
            bench.trainbus(steps, arm=True)
            print("  trainbus, no callbacks: PASS")
        except Exception as exc:
            ok = False
            print(f"  trainbus, no callbacks: FAIL {_first_line(exc)}")
        _synchronize(cuda)
    passed: list[tuple[str, Any, bool]] = []
    for name, factory, is_logger in builtin_callbacks(tmp):
        cb = factory()
        try:
            if is_logger:
                bench.trainbus(steps, loggers=[cb], arm=cuda)
            else:  # a logger, so that what it logs is resolved and written
                bench.trainbus(steps, [cb], loggers=[InMemoryLogger()], arm=cuda)
            verdict = "PASS" if cuda else "ran (no sync check on CPU)"
            passed.append((name, factory, is_logger))
        except Exception as exc:
            ok = False
            verdict = f"FAIL {_first_line(exc)}"
        _synchronize(cuda)
        print(f"  {name}: {verdict}")
    return ok, passed


def check_account(bench: Bench, cuda: bool) -> bool:
    """Step 2b: the time account with the default output (a progress bar, ``time/...``
    metrics, the end-of-fit table) adds no sync under ``set_sync_debug_mode("error")``,
    read live and after the fit; on CUDA it reports the device's compute from CUDA events."""
    steps = bench.args.check_steps
    model = bench.model()
    logger = InMemoryLogger()
    trainer = Trainer(
        model,
        StepClock(bench.batches, steps),
        f"{steps}ba",
        eval_dataloader=bench.eval_batches,
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3),
        loggers=[logger],
        device=bench.device,
        warn_slow_callbacks=False,
        progress=True,
    )
    try:
        with sync_debug("error", cuda), contextlib.redirect_stderr(io.StringIO()) as shown:
            trainer.fit_sync()
            live = trainer.time_account  # read with the check still armed
    except Exception as exc:
        print(f"  time account and default output: FAIL {_first_line(exc)}")
        _synchronize(cuda)
        return False
    _synchronize(cuda)
    acct = trainer.time_account
    assert acct is not None
    assert live is not None
    adds_up = abs(sum(acct.parts().values()) - acct.wall) <= 0.01 * acct.wall
    logged = "time/compute" in logger.data and "where the time went" in shown.getvalue()
    device = acct.device_compute
    device_ok = not cuda or (device is not None and device > 0)
    ok = adds_up and logged and device_ok
    on_device = "-" if device is None else f"{device * 1e3:.1f} ms"
    print(
        f"  time account and default output: {'PASS' if ok else 'FAIL'} (host compute "
        f"{acct.compute * 1e3:.1f} ms, device compute {on_device}, parts add up: "
        f"{'yes' if adds_up else 'NO'}, logged and printed: {'yes' if logged else 'NO'})"
    )
    return ok


def check_fp16_step(bench: Bench, steps: int = 4, clip: float = 0.5) -> bool:
    """Step 3: the fp16 step's gradients at AFTER_BACKWARD, AFTER_TRAIN_BATCH, BATCH_END."""
    model = bench.model()
    probe = StepProbe()
    trainer = Trainer(
        model, bench.batches[:steps], f"{steps}ba", precision="fp16", grad_clip_norm=clip,
        optimizers=torch.optim.SGD(model.parameters(), lr=1e-3), callbacks=[probe],
        device=bench.device, warn_slow_callbacks=False,
    )  # fmt: skip
    trainer.fit_sync()
    ok = trainer.state.scaler is not None and len(probe.rows) == 3 * steps
    for i in range(0, len(probe.rows) - 2, 3):
        (_, scale, raw, _), (_, _, grads, before), (_, _, _, after) = probe.rows[i : i + 3]
        unscaled = [g.float() / scale for g in raw]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in unscaled])))
        factor = min(1.0, clip / (norm + 1e-6))
        ok = ok and all(torch.isfinite(g).all() for g in grads)
        ok = ok and all(
            torch.allclose(g.float(), u * factor, rtol=1e-4, atol=1e-7)
            for g, u in zip(grads, unscaled, strict=True)
        )
        ok = ok and all(
            torch.allclose(a, b - 1e-3 * g, rtol=1e-5, atol=1e-6)
            for a, b, g in zip(after, before, grads, strict=True)
        )
    print(f"  fp16 step (scaler, unscaled and clipped at AFTER_TRAIN_BATCH): "
          f"{'PASS' if ok else 'FAIL'}")  # fmt: skip
    return bool(ok)


def time_configs(
    bench: Bench, cuda: bool, passed: list[tuple[str, Any, bool]]
) -> dict[str, float]:
    """Step 3: interleaved rounds; the median ms/step of each configuration."""
    args = bench.args
    skip = max(1, args.steps // 10)

    def with_callbacks(steps: int) -> StepClock:
        cbs = [f() for _, f, is_logger in passed if not is_logger]
        logs = [f() for _, f, is_logger in passed if is_logger]
        return bench.trainbus(steps, cbs, logs)

    configs: dict[str, Callable[[int], StepClock]] = {
        "plain loop": bench.plain,
        "trainbus, no callbacks": bench.trainbus,
        f"trainbus, {len(passed)} built-in callbacks": with_callbacks,
    }
    if args.each:  # where the cost of the callbacks goes: each alone (loggers alone too)
        for name, factory, is_logger in passed:
            configs[f"  {name} alone"] = partial(
                _alone, bench, factory, is_logger
            )
    bench.plain(max(skip * 2, 3))  # warm up kernels and the allocator
    _synchronize(cuda)
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, run in configs.items():  # not armed: the checks above did that
            clock = run(args.steps)
            _synchronize(cuda)
            samples[name] += clock.step_ms(skip)
    return {name: statistics.median(v) if v else float("nan") for name, v in samples.items()}


def _alone(bench: Bench, factory: Callable[[], Any], is_logger: bool, steps: int) -> StepClock:
    if is_logger:
        return bench.trainbus(steps, loggers=[factory()])
    return bench.trainbus(steps, [factory()], loggers=[InMemoryLogger()])


def _ddp_check(cpu: bool) -> int:
    """``--ddp``: the DDP and FSDP checks of ``scripts/ddp_check.py`` (on CUDA, or --cpu)."""
    import importlib.util

    path = Path(__file__).with_name("ddp_check.py")
    spec = importlib.util.spec_from_file_location("ddp_check", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code: int = module.run_ddp_check(cpu)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--cpu", action="store_true", help="dry run on the CPU (no sync check)")
    parser.add_argument("--steps", type=int, default=300, help="steps per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
    parser.add_argument("--each", action="store_true", help="also time each callback alone")
    parser.add_argument("--check-steps", type=int, default=None, help="steps per sync check")
    parser.add_argument("--width", type=int, default=None, help="MLP width (GPU 2048, CPU 64)")
    parser.add_argument("--batch-size", type=int, default=None, help="(GPU 512, CPU 32)")
    parser.add_argument(
        "--ddp", action="store_true", help="DDP and FSDP checks instead (scripts/ddp_check.py)"
    )
    args = parser.parse_args(argv)
    if args.ddp:
        return _ddp_check(args.cpu)
    if args.steps < 3 or args.rounds < 1:
        parser.error("--steps must be >= 3 and --rounds >= 1")
    cuda = not args.cpu
    if cuda and not torch.cuda.is_available():
        print(
            "gpu_check needs CUDA, and torch.cuda.is_available() is False here: nothing "
            "to check. Run it on a GPU machine, or use --cpu for a dry run of the script."
        )
        return 0
    device = torch.device("cuda" if cuda else "cpu")
    args.width = args.width or (2048 if cuda else 64)
    args.batch_size = args.batch_size or (512 if cuda else 32)
    args.check_steps = args.check_steps or min(args.steps, 30)
    name = torch.cuda.get_device_name(device) if cuda else "CPU (dry run)"
    print(
        f"trainbus {trainbus.__version__}, torch {torch.__version__}, {name}; MLP width "
        f"{args.width} x4, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds"
    )
    bench = Bench(args, device)
    with tempfile.TemporaryDirectory() as tmp:
        print("sync checks (torch.cuda.set_sync_debug_mode('error')):")
        ok, passed = check_syncs(bench, cuda, Path(tmp))
        ok = check_account(bench, cuda) and ok
        print("training step:")
        ok = check_fp16_step(bench) and ok
        print("step time (median ms/step):")
        medians = time_configs(bench, cuda, passed)
    base = medians["plain loop"]
    for label, ms in medians.items():
        print(f"  {label:<34} {ms:8.3f} ms  x{ms / base:.3f} of the plain loop")
    bare, full = list(medians.values())[1:3]
    print(f"  with / without callbacks: x{full / bare:.3f}")
    print("RESULT:", "OK" if ok else "FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
