"""The training step in Composer v0.6's order (issue 14).

Gradients are zeroed after ``BEFORE_TRAIN_BATCH``; each ``AFTER_BACKWARD`` sees them
accumulated so far (scaled, under fp16); ``AFTER_TRAIN_BATCH`` sees them complete,
unscaled and clipped, not yet applied; ``BATCH_END`` sees them applied. Every value is
checked against gradients computed by hand from the same batches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import TinyModel, make_loader, make_trainer
from trainbus import Callback, Event, Logger, State, Trainer, blocking
from trainbus.loggers import InMemoryLogger

E = Event
LR = 0.1
WATCHED = (
    E.BEFORE_TRAIN_BATCH, E.BEFORE_FORWARD, E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH, E.BATCH_END,
)  # fmt: skip


def _copy(tensors: Any) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().clone() for t in tensors]


class Probe(Callback):
    """Copies gradients, parameters, the grad scale and the lr at chosen events, in lockstep."""

    def __init__(self, events: tuple[Event, ...] = WATCHED) -> None:
        self.events = events
        self.rows: list[dict[str, Any]] = []

    @blocking
    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event not in self.events:
            return
        params = list(state.model.parameters())
        self.rows.append({
            "event": event,
            "grads": _copy(p.grad for p in params),
            "params": _copy(params),
            "scale": state.scaler.get_scale() if state.scaler is not None else 1.0,
            "lr": state.optimizers[0].param_groups[0]["lr"],
        })  # fmt: skip

    def at(self, event: Event) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["event"] is event]


def _grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, fp16: bool) -> list[Any]:
    """d(mean cross-entropy)/d(params), by hand, under the same autocast as the trainer."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
        loss = F.cross_entropy(model(x), y)
    return list(torch.autograd.grad(loss, list(model.parameters())))


def _reference(
    n_batches: int, grad_accum: int, fp16: bool, epochs: int = 1
) -> list[dict[str, Any]]:
    """Per batch: the cumulative gradient after each microbatch, the batch's gradient, and
    the parameters before and after an SGD step, computed by hand from the same data."""
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(TinyModel().lin.state_dict())
    out = []
    for x, y in [batch for _ in range(epochs) for batch in make_loader(n_batches)]:
        before = _copy(model.parameters())
        cumulative, partial = [], [torch.zeros_like(p) for p in model.parameters()]
        for xm, ym in zip(x.chunk(grad_accum), y.chunk(grad_accum), strict=True):
            weight = len(xm) / len(x)
            partial = [a + weight * g for a, g in zip(partial, _grads(model, xm, ym, fp16),
                                                     strict=True)]  # fmt: skip
            cumulative.append(partial)
        with torch.no_grad():
            for p, g in zip(model.parameters(), partial, strict=True):
                p -= LR * g
        out.append({"cumulative": cumulative, "grad": partial, "before": before,
                    "after": _copy(model.parameters())})  # fmt: skip
    return out


def _close(got: list[Any], want: list[Any], rtol: float) -> bool:
    return all(
        g is not None and torch.allclose(g.float(), w.float(), rtol=rtol, atol=rtol * 1e-3)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize(
    ("precision", "grad_accum"),
    [(None, 1), (None, 2), ("fp16", 1), ("fp16", 2)],
    ids=["fp32", "fp32-accum2", "fp16-scaler", "fp16-scaler-accum2"],
)
def test_gradient_state_at_each_event_matches_the_hand_computation(
    precision: str | None, grad_accum: int
) -> None:
    fp16 = precision == "fp16"
    probe = Probe()
    trainer = make_trainer(3, 1, [probe], precision=precision, grad_accum=grad_accum,
                           device="cpu")  # fmt: skip
    trainer.fit_sync()
    ref = _reference(3, grad_accum, fp16)
    rtol = 1e-2 if fp16 else 1e-5
    assert (trainer.state.scaler is not None) is fp16
    backward = probe.at(E.AFTER_BACKWARD)
    assert len(backward) == 3 * grad_accum
    for n, batch in enumerate(ref):
        start = probe.at(E.BEFORE_TRAIN_BATCH)[n]
        if n == 0:
            assert all(g is None for g in start["grads"])
        else:  # not zeroed yet: the previous batch's gradients, as in Composer
            assert _close(start["grads"], ref[n - 1]["grad"], rtol)
        assert all(g is None for g in probe.at(E.BEFORE_FORWARD)[n * grad_accum]["grads"])
        # AFTER_BACKWARD: present, accumulated so far, scaled by the grad scaler
        for i, row in enumerate(backward[n * grad_accum : (n + 1) * grad_accum]):
            unscaled = [g / row["scale"] for g in row["grads"]]
            assert _close(unscaled, batch["cumulative"][i], rtol)
            assert _close(row["params"], batch["before"], 1e-6)
        if fp16:
            assert backward[n * grad_accum]["scale"] == 2.0**16
        # AFTER_TRAIN_BATCH: complete and unscaled, not applied
        after = probe.at(E.AFTER_TRAIN_BATCH)[n]
        last = backward[(n + 1) * grad_accum - 1]
        assert _close(after["grads"], batch["grad"], rtol)
        assert _close(after["grads"], [g / last["scale"] for g in last["grads"]], 1e-6)
        assert _close(after["params"], batch["before"], 1e-6)
        # BATCH_END: applied (one SGD step with those gradients), gradients still there
        end = probe.at(E.BATCH_END)[n]
        stepped = [p - LR * g for p, g in zip(after["params"], after["grads"], strict=True)]
        assert _close(end["params"], stepped, 1e-6)
        assert _close(end["params"], batch["after"], rtol)
        assert _close(end["grads"], after["grads"], 0.0)


def test_grad_clip_norm_clips_the_unscaled_gradients_before_after_train_batch() -> None:
    probe = Probe((E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH))
    make_trainer(3, 1, [probe], precision="fp16", grad_clip_norm=0.05, device="cpu").fit_sync()
    for raw, clipped in zip(probe.at(E.AFTER_BACKWARD), probe.at(E.AFTER_TRAIN_BATCH),
                            strict=True):  # fmt: skip
        unscaled = [g / raw["scale"] for g in raw["grads"]]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in unscaled])))
        assert norm > 0.05  # so the clip does something
        total = torch.linalg.vector_norm(torch.stack([g.norm() for g in clipped["grads"]]))
        assert float(total) == pytest.approx(0.05, rel=1e-4)
        assert _close(clipped["grads"], [g * (0.05 / norm) for g in unscaled], 1e-4)
    first = _reference(3, 1, fp16=True)[0]["grad"]  # the first batch's, by hand
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in first])))
    assert _close(probe.at(E.AFTER_TRAIN_BATCH)[0]["grads"], [g * 0.05 / norm for g in first],
                  1e-2)  # fmt: skip


def test_without_grad_clip_norm_nothing_is_clipped() -> None:
    probe = Probe((E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH))
    make_trainer(2, 1, [probe], device="cpu").fit_sync()
    for raw, final in zip(probe.at(E.AFTER_BACKWARD), probe.at(E.AFTER_TRAIN_BATCH), strict=True):
        assert _close(final["grads"], raw["grads"], 0.0)


def test_schedulers_step_after_after_train_batch_and_before_batch_end() -> None:
    model = TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    probe = Probe((E.AFTER_TRAIN_BATCH, E.BATCH_END))
    Trainer(model, make_loader(2), "1ep", optimizers=opt, callbacks=[probe], device="cpu",
            schedulers=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
            ).fit_sync()  # fmt: skip
    assert [r["lr"] for r in probe.rows] == [1.0, 0.5, 0.5, 0.25]


class InfAfterBackward(Callback):
    """Poisons one gradient on the first batch, as an fp16 overflow would."""

    @blocking
    def after_backward(self, state: State, logger: Logger) -> None:
        if int(state.timer.batch) == 0:
            state.model.lin.weight.grad[0, 0] = float("inf")


def test_fp16_overflow_skips_the_step_and_backs_the_scale_off() -> None:
    probe = Probe((E.AFTER_TRAIN_BATCH, E.BATCH_END))
    trainer = make_trainer(2, 1, [InfAfterBackward(), probe], precision="fp16", device="cpu")
    trainer.fit_sync()
    first_after, first_end, second_after, second_end = probe.rows
    assert _close(first_end["params"], first_after["params"], 0.0)  # skipped
    assert first_end["scale"] == 2.0**15  # scaler.update() ran before BATCH_END
    assert not _close(second_end["params"], second_after["params"], 0.0)  # stepped
    assert trainer.state.state_dict()["scaler"]["scale"] == 2.0**15


def test_bf16_has_no_scaler_and_fp32_state_dict_has_no_scaler_entry() -> None:
    assert make_trainer(1, 1, precision="bf16", device="cpu").state.scaler is None
    fp16 = make_trainer(1, 1, precision="fp16", device="cpu").state
    assert isinstance(fp16.scaler, torch.amp.GradScaler)
    assert "scaler" in fp16.state_dict()
    assert "scaler" not in make_trainer(1, 1, device="cpu").state.state_dict()
    amp = make_trainer(1, 1, precision="amp", device="cpu").state  # Composer v0.6's name
    assert isinstance(amp.scaler, torch.amp.GradScaler)


def test_scaler_state_round_trips_through_the_state_dict() -> None:
    trainer = make_trainer(2, 1, [InfAfterBackward()], precision="fp16", device="cpu")
    trainer.fit_sync()
    saved = trainer.state.state_dict()
    fresh = make_trainer(2, 1, precision="fp16", device="cpu").state
    assert fresh.scaler is not None
    assert fresh.scaler.get_scale() == 2.0**16
    fresh.load_state_dict(saved)
    assert fresh.scaler.get_scale() == 2.0**15


# -- a Composer-v0.6-style gradient monitor, ported by its imports ---------------------------


class LayerGradNorms(Callback):
    """Per-layer gradient L2 norms at ``after_train_batch``, written the Composer v0.6 way:
    a plain method on ``state.model``'s gradients, logged with ``logger.data_batch``."""

    def after_train_batch(self, state: State, logger: Logger) -> None:
        norms = {}
        squares = 0.0
        for name, p in state.model.named_parameters():
            if p.grad is not None:
                norm = p.grad.detach().norm(2).item()
                norms[f"layer_grad_l2_norm/{name}"] = norm
                squares += norm**2
        norms["grad_l2_norm/step"] = squares**0.5
        logger.data_batch(norms)


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_a_composer_style_grad_monitor_reads_the_norms_computed_by_hand(grad_accum: int) -> None:
    logs = InMemoryLogger()
    make_trainer(3, 2, [LayerGradNorms()], loggers=[logs], grad_accum=grad_accum,
                 device="cpu").fit_sync()  # fmt: skip
    ref = _reference(3, grad_accum, fp16=False, epochs=2)
    weight, bias = ([float(r["grad"][i].norm()) for r in ref] for i in (0, 1))
    total = [float(torch.cat([g.flatten() for g in r["grad"]]).norm()) for r in ref]
    expected = {"weight": weight, "bias": bias, "total": total}
    for key, name in (
        ("weight", "layer_grad_l2_norm/lin.weight"),
        ("bias", "layer_grad_l2_norm/lin.bias"),
        ("total", "grad_l2_norm/step"),
    ):
        got = logs.get_timeseries(name)[name]
        assert got == pytest.approx(expected[key], rel=1e-5)
        assert all(v > 0 for v in got)  # never the 0.0 of gradients already zeroed


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="fp16 with a CUDA GradScaler needs a CUDA device; scripts/gpu_check.py runs this "
    "check (step 3, 'fp16 step') on GPU machines",
)
def test_fp16_on_cuda_unscales_before_after_train_batch() -> None:  # pragma: no cover - GPU
    probe = Probe((E.AFTER_BACKWARD, E.AFTER_TRAIN_BATCH, E.BATCH_END))
    trainer = make_trainer(3, 1, [probe], precision="fp16", grad_clip_norm=10.0, device="cuda")
    trainer.fit_sync()
    assert trainer.state.scaler is not None
    rows = zip(probe.at(E.AFTER_BACKWARD), probe.at(E.AFTER_TRAIN_BATCH), probe.at(E.BATCH_END),
               strict=True)  # fmt: skip
    for raw, after, end in rows:
        assert raw["scale"] == 2.0**16
        assert all(g.device.type == "cuda" for g in after["grads"])
        assert _close(after["grads"], [g / raw["scale"] for g in raw["grads"]], 1e-6)
        stepped = [p - LR * g for p, g in zip(after["params"], after["grads"], strict=True)]
        assert _close(end["params"], stepped, 1e-6)
