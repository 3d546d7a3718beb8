"""Mistakes a newcomer makes (issue 58): each gets a message naming the argument and the
fix, at construction when the value can be checked then, at the first batch otherwise."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers import TinyModel, make_loader
from trainbus import Trainer


def plain(**kw: Any) -> Trainer:
    kw.setdefault("loss_fn", F.cross_entropy)
    return Trainer(torch.nn.Linear(4, 3), make_loader(2), "1ep", **kw)


def test_a_loss_fn_of_one_argument_is_refused_at_construction() -> None:
    def loss(outputs: torch.Tensor) -> torch.Tensor:
        return outputs.sum()

    with pytest.raises(TypeError, match=r"loss_fn=loss\(outputs\) must take "
                       r"two arguments.*loss_fn\(outputs, targets\)"):  # fmt: skip
        plain(loss_fn=loss)


def test_a_model_loss_of_one_argument_is_refused_at_construction() -> None:
    class OneArg(TinyModel):
        def loss(self, outputs: Any) -> torch.Tensor:  # type: ignore[override]
            return outputs.sum()

    with pytest.raises(TypeError, match=r"model.loss\(outputs\) must take \(outputs, batch\)"):
        Trainer(OneArg(), make_loader(2), "1ep")


@pytest.mark.parametrize("loss_fn", [F.mse_loss, torch.nn.MSELoss(), F.l1_loss])
def test_class_targets_with_an_elementwise_loss_name_the_classification_loss(
    loss_fn: Any,
) -> None:
    trainer = plain(loss_fn=loss_fn)  # the targets' shape is known at the first batch only
    with pytest.raises(ValueError, match=r"loss_fn=\w+ compares outputs and targets element by "
                       r"element.*\(4, 3\).*\(4,\).*class indices.*loss_fn=F.cross_entropy"):
        trainer.fit_sync()


def test_regression_targets_of_another_shape_name_the_reshape() -> None:
    x, y = torch.randn(8, 4), torch.randn(8)
    trainer = Trainer(torch.nn.Linear(4, 1), DataLoader(TensorDataset(x, y), batch_size=4),
                      "1ep", loss_fn=F.mse_loss)  # fmt: skip
    with pytest.raises(ValueError, match=r"\(4, 1\) and the targets shape \(4,\).*same shape.*"
                       r"outputs.squeeze\(-1\)"):  # fmt: skip
        trainer.fit_sync()


def test_a_function_as_scheduler_is_refused_at_construction_with_lambdalr() -> None:
    with pytest.raises(TypeError, match=r"schedulers is a function.*LambdaLR\(optimizer, "
                       r"lr_lambda=fn\)"):  # fmt: skip
        plain(schedulers=lambda step: 0.1)
    with pytest.raises(TypeError, match=r"schedulers\[1\] is a function"):
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        Trainer(model, make_loader(2), "1ep", loss_fn=F.cross_entropy, optimizers=opt,
                schedulers=[sched, lambda step: 0.1])  # fmt: skip


def test_a_scheduler_class_or_other_object_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"schedulers is the class StepLR.*StepLR\(optimizer"):
        plain(schedulers=torch.optim.lr_scheduler.StepLR)
    with pytest.raises(TypeError, match=r"schedulers is a float, which has no step\(\)"):
        plain(schedulers=0.1)


def test_a_scheduler_over_an_optimizer_the_trainer_does_not_step_is_refused() -> None:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    with pytest.raises(ValueError, match=r"schedulers\[0\] \(StepLR\) adjusts an optimizer that "
                       r"the trainer does not step \(it steps the default AdamW\).*optimizers="):
        Trainer(model, make_loader(2), "1ep", loss_fn=F.cross_entropy, schedulers=sched)


def test_model_and_dataloader_swapped_say_so() -> None:
    model, loader = torch.nn.Linear(4, 3), make_loader(2)
    with pytest.raises(TypeError, match=r"model is a DataLoader and train_dataloader a Linear.*"
                       r"look swapped.*Trainer\(model, train_dataloader, max_duration\)"):
        Trainer(loader, model, "1ep", loss_fn=F.cross_entropy)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got DataLoader; pass the model first"):
        Trainer(loader, loader, "1ep", loss_fn=F.cross_entropy)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got function; wrap your function in an nn.Module"):
        Trainer(lambda x: x, loader, "1ep", loss_fn=F.cross_entropy)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["train_dataloader", "eval_dataloader"])
def test_a_dataset_as_loader_names_the_dataloader_to_wrap_it_in(name: str) -> None:
    dataset = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    kw: dict[str, Any] = {"loss_fn": F.cross_entropy}
    if name == "eval_dataloader":
        kw["eval_dataloader"] = dataset
        loader: Any = make_loader(2)
    else:
        loader = dataset
    with pytest.raises(TypeError, match=rf"{name} is a TensorDataset, a map-style Dataset: "
                       r"iterating it gives one sample at a time.*DataLoader\(dataset, "
                       r"batch_size=32"):  # fmt: skip
        Trainer(torch.nn.Linear(4, 3), loader, "1ep", **kw)
