"""Resuming with ``Trainer(load_path=...)``: the same events, timer, state and weights."""

from __future__ import annotations

import collections
import pathlib
import shutil
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainbus import (
    Callback,
    CheckpointLoadError,
    CheckpointSaveError,
    Event,
    LogLevel,
    Time,
    Timestamp,
    TimeUnit,
    Trainer,
)
from trainbus.callbacks import CheckpointSaver

N_BATCHES = 3


class DropoutModel(torch.nn.Module):
    """Dropout draws from torch's generator: the weights depend on the RNG stream."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.lin1 = torch.nn.Linear(4, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.lin2 = torch.nn.Linear(8, 3)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.lin2(self.drop(torch.relu(self.lin1(batch[0]))))

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, batch[1])


def shuffled_loader() -> DataLoader[Any]:
    """Shuffled with torch's global generator: each epoch's order depends on the RNG."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_BATCHES * 4, 4, generator=g)
    y = torch.randint(0, 3, (N_BATCHES * 4,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


class Recorder(Callback):
    """Every event with its timer values and the first sample of the batch."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, int]]] = []

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.events.append((event.value, state.timer.state_dict()))


class Counter(Callback):
    """A stateful callback; its state holds a deque (which weights_only must load)."""

    def __init__(self) -> None:
        self.batches = 0
        self.recent: collections.deque[int] = collections.deque(maxlen=2)

    def batch_end(self, state: Any, logger: Any) -> None:
        self.batches += 1
        self.recent.append(int(state.timer.batch))

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "recent": self.recent}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = state["batches"]
        self.recent = state["recent"]


def run(
    folder: pathlib.Path, *, seed: int, load_path: Any = None
) -> tuple[Trainer, Recorder, Counter]:
    recorder, counter = Recorder(), Counter()
    saver = CheckpointSaver(folder, save_interval="1ba")
    trainer = Trainer(
        DropoutModel(seed),
        shuffled_loader(),
        "2ep",
        optimizers=None,
        callbacks=[recorder, counter, saver],
        device="cpu",
        seed=0,
        load_path=load_path,
    )
    trainer.fit_sync()
    return trainer, recorder, counter


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trainer, Recorder, Counter]:
    return run(tmp_path_factory.mktemp("full"), seed=0)


def after_checkpoint(events: list[tuple[str, dict[str, int]]], batch: int) -> list[Any]:
    """The events an uninterrupted run fires after its checkpoint at ``batch``."""
    for i, (name, ts) in enumerate(events):
        if name == "batch_checkpoint" and ts["batch"] == batch:
            return events[i + 1 :]
    raise AssertionError(f"no checkpoint at batch {batch}")


def check_resumed(
    full: tuple[Trainer, Recorder, Counter], resumed: tuple[Trainer, Recorder, Counter]
) -> None:
    trainer, recorder, counter = resumed
    full_trainer, full_recorder, full_counter = full
    # The resumed run: INIT (constructor), FIT_START, then exactly the rest of the full run.
    names = [name for name, _ in recorder.events]
    assert names[:2] == ["init", "fit_start"]
    assert recorder.events[2:] == after_checkpoint(full_recorder.events, 1)
    assert "epoch_start" not in names[:3]  # mid-epoch: no EPOCH_START for epoch 0
    assert counter.batches == full_counter.batches == 2 * N_BATCHES
    assert counter.recent == full_counter.recent == collections.deque([5, 6])
    assert trainer.state.timer.state_dict() == full_trainer.state.timer.state_dict()
    full_weights = full_trainer.state.model.state_dict()
    for name, value in trainer.state.model.state_dict().items():
        assert torch.equal(value, full_weights[name]), name


def test_resume_from_file_matches_uninterrupted_run(
    tmp_path: pathlib.Path, uninterrupted: tuple[Trainer, Recorder, Counter]
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    checkpoint = full_folder / "ep0-ba1-rank0.pt"
    resumed = run(tmp_path / "resumed", seed=123, load_path=checkpoint)
    check_resumed(uninterrupted, resumed)


def test_resume_from_folder_takes_newest_complete(
    tmp_path: pathlib.Path, uninterrupted: tuple[Trainer, Recorder, Counter]
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    shutil.copy(full_folder / "ep0-ba1-rank0.pt", crashed / "ep0-ba1-rank0.pt")
    # A newer write that was interrupted: never taken for a checkpoint.
    partial = (full_folder / "ep0-ba2-rank0.pt").read_bytes()
    (crashed / ".ep0-ba2-rank0.pt.partial-0a1b2c3d").write_bytes(partial[: len(partial) // 2])
    resumed = run(crashed, seed=123, load_path=crashed)
    check_resumed(uninterrupted, resumed)
    saver = resumed[0].state.callbacks[2]
    assert isinstance(saver, CheckpointSaver)
    # The saver resumed its own list: the loaded checkpoint, then those written since.
    assert [int(ts.batch) for ts, _ in saver.saved_checkpoints] == [1, 2, 3, 4, 5, 6]


def test_resume_at_epoch_end_fires_no_epoch_start_twice(
    tmp_path: pathlib.Path, uninterrupted: tuple[Trainer, Recorder, Counter]
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    resumed = run(tmp_path / "r", seed=7, load_path=full_folder / "ep0-ba3-rank0.pt")
    _, recorder, _ = resumed
    assert recorder.events[2:] == after_checkpoint(uninterrupted[1].events, 3)
    assert recorder.events[2][0] == "epoch_end"


def test_empty_folder_starts_fresh(tmp_path: pathlib.Path) -> None:
    (tmp_path / "empty").mkdir()
    _, recorder, counter = run(tmp_path / "out", seed=0, load_path=tmp_path / "empty")
    assert recorder.events[2] == ("epoch_start", recorder.events[1][1])
    assert counter.batches == 2 * N_BATCHES


def test_missing_folder_of_the_runs_saver_starts_fresh(tmp_path: pathlib.Path) -> None:
    _, recorder, counter = run(tmp_path / "new", seed=0, load_path=tmp_path / "new")
    assert [name for name, _ in recorder.events[:3]] == ["init", "fit_start", "epoch_start"]
    assert counter.batches == 2 * N_BATCHES


def test_missing_path_names_it(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.pt"
    with pytest.raises(CheckpointLoadError, match=r"nope.pt.*does not exist"):
        Trainer(DropoutModel(0), shuffled_loader(), "1ep", load_path=missing, device="cpu")


def test_load_path_of_wrong_type() -> None:
    with pytest.raises(TypeError, match="load_path=3 must be a path"):
        Trainer(DropoutModel(0), shuffled_loader(), "1ep", load_path=3, device="cpu")  # type: ignore[arg-type]


def test_truncated_checkpoint_names_path(
    tmp_path: pathlib.Path, uninterrupted: tuple[Trainer, Recorder, Counter]
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    data = (full_folder / "ep0-ba1-rank0.pt").read_bytes()
    torn = tmp_path / "torn.pt"
    torn.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointLoadError, match=r"torn.pt.*truncated or corrupt"):
        Trainer(DropoutModel(0), shuffled_loader(), "1ep", load_path=torn, device="cpu")


def test_corrupt_and_foreign_files_name_path(tmp_path: pathlib.Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(CheckpointLoadError, match=r"garbage.pt.*truncated or corrupt"):
        Trainer(DropoutModel(0), shuffled_loader(), "1ep", load_path=garbage, device="cpu")
    plain = tmp_path / "plain.pt"
    torch.save({"model": DropoutModel(0).state_dict()}, plain)
    with pytest.raises(CheckpointLoadError, match=r"plain.pt.*is not a trainbus checkpoint"):
        Trainer(DropoutModel(0), shuffled_loader(), "1ep", load_path=plain, device="cpu")


class OtherModel(DropoutModel):
    def __init__(self) -> None:
        super().__init__(0)
        self.lin2 = torch.nn.Linear(8, 5)
        self.extra = torch.nn.Linear(2, 2)


def test_checkpoint_of_another_model_names_the_mismatch(
    uninterrupted: tuple[Trainer, Recorder, Counter],
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    path = full_folder / "ep0-ba1-rank0.pt"
    with pytest.raises(CheckpointLoadError) as info:
        Trainer(OtherModel(), shuffled_loader(), "1ep", load_path=path, device="cpu")
    message = str(info.value)
    assert "ep0-ba1-rank0.pt" in message
    assert "checkpoint of another model" in message
    assert "extra.weight" in message  # not in the checkpoint
    assert "lin2.weight: checkpoint (3, 8) vs model (5, 8)" in message


def test_checkpoint_with_other_optimizers_names_them(
    uninterrupted: tuple[Trainer, Recorder, Counter],
) -> None:
    full_folder = uninterrupted[0].state.callbacks[2].folder  # type: ignore[attr-defined]
    model = DropoutModel(0)
    opts = [torch.optim.SGD([p], lr=0.1) for p in model.parameters()]
    with pytest.raises(CheckpointLoadError, match=r"holds 1 optimizers but the trainer has 4"):
        Trainer(
            model,
            shuffled_loader(),
            "1ep",
            optimizers=opts,
            load_path=full_folder / "ep0-ba1-rank0.pt",
            device="cpu",
        )


class Batches(Callback):
    """The first feature of each training batch, in order."""

    def __init__(self) -> None:
        self.firsts: list[list[float]] = []

    def after_dataloader(self, state: Any, logger: Any) -> None:
        self.firsts.append(state.batch[0][:, 0].tolist())


def test_distributed_sampler_epoch_is_honoured_on_resume(tmp_path: pathlib.Path) -> None:
    from torch.utils.data.distributed import DistributedSampler

    def fit(folder: pathlib.Path, load_path: Any = None) -> Batches:
        data = shuffled_loader().dataset
        sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
        batches = Batches()
        Trainer(
            DropoutModel(0),
            DataLoader(data, batch_size=4, sampler=sampler),
            "2ep",
            callbacks=[batches, CheckpointSaver(folder, save_interval="1ba")],
            device="cpu",
            load_path=load_path,
        ).fit_sync()
        return batches

    full = fit(tmp_path / "full")
    assert full.firsts[:N_BATCHES] != full.firsts[N_BATCHES:]  # set_epoch: a new order
    resumed = fit(tmp_path / "resumed", tmp_path / "full" / "ep1-ba4-rank0.pt")
    assert resumed.firsts == full.firsts[4:]


def test_load_errors_are_raised_before_init(tmp_path: pathlib.Path) -> None:
    recorder = Recorder()
    with pytest.raises(CheckpointLoadError):
        Trainer(
            DropoutModel(0),
            shuffled_loader(),
            "1ep",
            callbacks=[recorder],
            load_path=tmp_path / "missing.pt",
            device="cpu",
        )
    assert recorder.events == []  # INIT never ran: nothing to close


# --- batch-wise evaluation and resuming (issue 31) ---------------------------------------------


def eval_run(folder: pathlib.Path, *, load_path: Any = None) -> tuple[Trainer, Recorder]:
    """5 epochs of 4 batches, evaluating and saving every 2 batches: 10 evaluations."""
    recorder = Recorder()
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))
    trainer = Trainer(
        DropoutModel(0),
        DataLoader(data, batch_size=4),
        "5ep",
        eval_dataloader=DataLoader(data, batch_size=8),
        eval_interval="2ba",
        callbacks=[recorder, CheckpointSaver(folder, save_interval="2ba")],
        device="cpu",
        seed=0,
        load_path=load_path,
    )
    trainer.fit_sync()
    return trainer, recorder


def test_a_run_resumed_from_a_batch_checkpoint_fires_every_remaining_evaluation(
    tmp_path: pathlib.Path,
) -> None:
    _, full = eval_run(tmp_path / "full")
    full_names = [name for name, _ in full.events]
    assert full_names.count("eval_start") == 10
    for batch in (2, 4, 10):
        checkpoint = tmp_path / "full" / f"ep{(batch - 1) // 4}-ba{batch}-rank0.pt"
        _, resumed = eval_run(tmp_path / f"resumed{batch}", load_path=checkpoint)
        rest = after_checkpoint(full.events, batch)
        assert resumed.events[2:] == rest
        done = full_names[: len(full_names) - len(rest)].count("eval_start")
        assert done + [n for n, _ in resumed.events].count("eval_start") == 10


# --- what a callback may keep in its state (issue 31) ------------------------------------------


class KeepsTrainbusValues(Callback):
    """Counts events by ``Event`` key and keeps trainbus's value types in its state."""

    def __init__(self) -> None:
        self.counts: dict[Event, int] = {}
        self.loaded: dict[str, Any] | None = None

    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "every": Time(2, "ba"),
            "unit": TimeUnit.EPOCH,
            "level": LogLevel.BATCH,
            "last": Timestamp(epoch=1, batch=3),
            "seen": {Event.BATCH_END, Event.EPOCH_END},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state
        self.counts = dict(state["counts"])


def test_event_keys_and_trainbus_values_in_a_callback_state_resume(
    tmp_path: pathlib.Path,
) -> None:
    first = KeepsTrainbusValues()
    saver = CheckpointSaver(tmp_path, save_interval="1ep")
    Trainer(DropoutModel(0), shuffled_loader(), "1ep", callbacks=[first, saver],
            device="cpu").fit_sync()  # fmt: skip
    resumed = KeepsTrainbusValues()
    Trainer(DropoutModel(0), shuffled_loader(), "2ep", callbacks=[resumed], device="cpu",
            load_path=tmp_path)  # fmt: skip
    assert resumed.loaded == first.state_dict() | {"counts": resumed.loaded["counts"]}
    saved_counts = resumed.loaded["counts"]
    assert saved_counts[Event.BATCH_END] == N_BATCHES
    assert all(type(key) is Event for key in saved_counts)


class KeepsAnObject(Callback):
    def state_dict(self) -> dict[str, Any]:
        return {"history": [1, {"best": pathlib.PurePosixPath("a")}]}


def test_a_state_the_loader_would_refuse_is_refused_when_saved(tmp_path: pathlib.Path) -> None:
    saver = CheckpointSaver(tmp_path, save_interval="1ba")
    trainer = Trainer(DropoutModel(0), shuffled_loader(), "1ep",
                      callbacks=[KeepsAnObject(), saver], device="cpu")  # fmt: skip
    with pytest.raises(CheckpointSaveError) as caught:
        trainer.fit_sync()
    message = str(caught.value)
    assert message.startswith(
        "callback tests.test_resume.KeepsAnObject#0: state_dict()['history'][1]['best'] is a "
        "pathlib.PurePosixPath, which a checkpoint cannot hold"
    )
    assert "torch.serialization.add_safe_globals([PurePosixPath])" in message
    assert not list(tmp_path.glob("*.pt"))  # nothing written that could not be resumed


def test_a_run_with_steps_per_epoch_resumes_at_the_end_of_a_shortened_epoch(
    tmp_path: pathlib.Path,
) -> None:
    def short_run(folder: pathlib.Path, load_path: Any = None) -> Recorder:
        recorder = Recorder()
        trainer = Trainer(DropoutModel(0), shuffled_loader(), "2ep", device="cpu", seed=0,
                          callbacks=[recorder, CheckpointSaver(folder, save_interval="1ba")],
                          load_path=load_path)  # fmt: skip
        trainer.state.steps_per_epoch = N_BATCHES - 1  # Composer's way to shorten epochs
        trainer.fit_sync()
        return recorder

    full = short_run(tmp_path / "full")
    assert [ts["batch"] for name, ts in full.events if name == "epoch_end"] == [2, 4]
    resumed = short_run(tmp_path / "resumed", load_path=tmp_path / "full" / "ep0-ba2-rank0.pt")
    assert resumed.events[2:] == after_checkpoint(full.events, 2)
    assert resumed.events[2][0] == "epoch_end"  # the shortened epoch ends: no third batch
