"""The slow-callback warning (``SlowCallbackWarning``) and its statistic.

D7: measured time never changes what a run does. The warning is a report: under filters
that make warnings errors (``python -W error``, pytest's ``filterwarnings = error``) it is
shown, not raised, and the run trains to the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback, SlowCallbackWarning


class Sluggish(Callback):
    def batch_end(self, state: Any, logger: Any) -> None:
        time.sleep(0.25)  # far longer than a batch of TinyModel, even on a loaded machine


def test_slow_callback_warning_names_the_callback_and_event_once() -> None:
    trainer = make_trainer(5, callbacks=[Sluggish()])  # checked at batches 2-4
    with pytest.warns(SlowCallbackWarning) as record:
        trainer.fit_sync()
    slow = [w for w in record if issubclass(w.category, SlowCallbackWarning)]
    assert len(slow) == 1
    assert "Sluggish" in str(slow[0].message) and "Event.BATCH_END" in str(slow[0].message)


def test_no_slow_callback_warning_when_disabled() -> None:
    trainer = make_trainer(5, callbacks=[Sluggish()], warn_slow_callbacks=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.fit_sync()
    assert not [w for w in record if issubclass(w.category, SlowCallbackWarning)]
    # the statistic is kept whether or not it warns
    assert trainer.engine.statistics().callbacks[0].slow


def test_slow_warning_under_error_filter_is_shown_not_raised() -> None:
    """Warnings are errors here: the warning is shown (recorded) and the run trains every
    batch; the check's finding is a statistic."""
    trainer = make_trainer(5, callbacks=[Sluggish()])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("error")
        trainer.fit_sync()
    assert int(trainer.state.timer.batch) == 5
    assert [w for w in record if issubclass(w.category, SlowCallbackWarning)]
    stats = trainer.engine.statistics().callbacks[0]
    assert stats.name == "Sluggish" and stats.slow and stats.slow_batches >= 2


_SCRIPT = """
import time, torch
from torch.utils.data import DataLoader, TensorDataset
from trainbus import Callback, Trainer

class Sleepy(Callback):
    def batch_end(self, state, logger):
        time.sleep(0.25)  # slower than the batch: the check marks it slow at batch 4

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
    def forward(self, batch):
        return self.lin(batch[0])
    def loss(self, out, batch):
        return torch.nn.functional.cross_entropy(out, batch[1])

model = Model()
data = DataLoader(TensorDataset(torch.randn(20, 4), torch.randint(0, 3, (20,))), batch_size=4)
trainer = Trainer(model=model, train_dataloader=data, max_duration="1ep",
                  optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                  callbacks=[Sleepy()])
trainer.fit_sync()
slow = trainer.engine.statistics().callbacks[0].slow
print("batches", int(trainer.state.timer.batch), "slow", slow)
"""


@pytest.mark.slow  # a fresh interpreter importing torch: several seconds on 2 loaded cores
def test_slow_callback_under_python_W_error_trains_to_the_end(tmp_path: Path) -> None:
    script = tmp_path / "slow_run.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "batches 5 slow True" in done.stdout
    # shown on stderr as a warning, at the handler's own line, not raised
    assert "SlowCallbackWarning: callback Sleepy spends longer" in done.stderr
    assert "slow_run.py:" in done.stderr
    assert "Traceback" not in done.stderr
