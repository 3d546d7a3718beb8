"""ProgressBar: tqdm bars on terminals, plain lines elsewhere, the latest loss in both."""

from __future__ import annotations

import io
import re
import sys
import threading
from typing import Any

import pytest

from tests.helpers import make_trainer
from trainbus import Callback
from trainbus.callbacks import ProgressBar
from trainbus.core.callback import resolve_callback
from trainbus.loggers import InMemoryLogger


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, and notes the thread of every write."""

    tty = True

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.threads.add(threading.current_thread().name)
        return super().write(s)


class Pipe(Terminal):
    tty = False


def losses(logs: InMemoryLogger) -> dict[int, float]:
    ts = logs.get_timeseries("loss/train")
    return dict(zip(ts["step"], ts["loss/train"], strict=True))


def test_plain_lines_when_the_stream_is_not_a_terminal() -> None:
    out, logs = Pipe(), InMemoryLogger()
    bar = ProgressBar(stream=out, interval="2ba")
    make_trainer(4, 2, loggers=[logs, bar], eval_batches=1).fit_sync()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    heads = [re.sub(r"  loss .*", "", line) for line in lines]
    assert heads == [
        "epoch 1/2  batch 2/4",
        "epoch 1/2  batch 4/4",
        "epoch 1/2 done  batch 4",
        "eval at batch 4",
        "epoch 2/2  batch 2/4",
        "epoch 2/2  batch 4/4",
        "epoch 2/2 done  batch 8",
        "eval at batch 8",
    ]
    loss = losses(logs)
    assert lines[0].endswith(f"loss {loss[2]:.4g}")
    assert lines[4].startswith(f"epoch 2/2  batch 2/4  loss {loss[6]:.4g}  eval/loss ")
    eval_loss = logs.get_timeseries("eval/loss")["eval/loss"]
    assert lines[3] == f"eval at batch 4  loss {loss[4]:.4g}  eval/loss {eval_loss[0]:.4g}"


def test_tqdm_bar_per_epoch_on_a_terminal_with_the_loss_in_the_postfix() -> None:
    out, logs = Terminal(), InMemoryLogger()
    make_trainer(4, 2, loggers=[logs, ProgressBar(stream=out)], eval_batches=1).fit_sync()
    text = out.getvalue()
    final = [chunk for chunk in re.split(r"[\r\n]", text) if "100%" in chunk]
    assert any(c.startswith("Epoch 1/2: 100%") and "4/4" in c for c in final)
    assert any(c.startswith("Epoch 2/2: 100%") and "4/4" in c for c in final)
    loss = losses(logs)
    assert f"loss={loss[8]:.4g}" in final[-1]
    eval_loss = logs.get_timeseries("eval/loss")["eval/loss"]
    assert f"eval/loss={eval_loss[-1]:.4g}" in final[-1]
    assert text.count("\n") == 2  # two bars, each left on its own line


def test_one_bar_for_the_whole_run_when_the_duration_is_in_batches() -> None:
    out = Terminal()
    make_trainer(4, max_duration="6ba", loggers=[ProgressBar(stream=out)]).fit_sync()
    text = out.getvalue()
    assert "Epoch" not in text
    assert re.search(r"Train: 100%.*6/6", text)
    assert text.count("\n") == 1


def test_writes_never_happen_on_the_event_loop_thread() -> None:
    out = Terminal()
    loop_thread = threading.current_thread().name  # fit_sync runs the loop here
    make_trainer(4, 2, loggers=[ProgressBar(stream=out)]).fit_sync()
    assert out.threads
    assert loop_thread not in out.threads
    table = resolve_callback(ProgressBar(stream=out))
    assert all(not h.is_async and not h.is_blocking for h in table.handlers.values())


def test_no_tqdm_monitor_thread_outlives_fit() -> None:
    from tqdm import TMonitor

    make_trainer(2, 1, loggers=[ProgressBar(stream=Terminal())]).fit_sync()
    assert not [t for t in threading.enumerate() if isinstance(t, TMonitor)]


def test_without_loggers_the_loss_is_read_from_state() -> None:
    out = Pipe()
    trainer = make_trainer(2, 1, [ProgressBar(stream=out, interval="1ba")])
    trainer.fit_sync()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert all(re.search(r"loss \d", line) for line in lines)


def test_forced_modes() -> None:
    pipe = Pipe()
    make_trainer(2, 1, loggers=[ProgressBar("tqdm", stream=pipe)]).fit_sync()
    assert "2/2" in pipe.getvalue()
    assert "\r" in pipe.getvalue()
    tty = Terminal()
    make_trainer(2, 1, loggers=[ProgressBar("plain", stream=tty, interval="1ep")]).fit_sync()
    assert tty.getvalue().splitlines()[0].startswith("epoch 1/1 done  batch 2")


def test_missing_tqdm_is_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'trainbus\[progress\]'"):
        ProgressBar("tqdm")
    out = Terminal()  # auto mode on a terminal falls back to lines
    make_trainer(2, 1, loggers=[ProgressBar(stream=out, interval="1ba")]).fit_sync()
    assert out.getvalue().startswith("epoch 1/1  batch 1/2")


def test_default_stream_is_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    make_trainer(2, 1, loggers=[ProgressBar(interval="1ba")]).fit_sync()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "epoch 1/1  batch 2/2" in captured.err


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"bar": "fancy"}, ValueError, r"ProgressBar\(bar='fancy'\) must be one of auto, tqdm"),
        ({"stream": 3}, TypeError, r"ProgressBar\(stream=3\) must be a text stream"),
        ({"interval": "0ba"}, ValueError, r"ProgressBar\(interval=\.\.\.\)='0ba' must be"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ProgressBar(**kwargs)  # type: ignore[arg-type]


class Printer(Callback):
    """``print()`` from handlers on the loop and on a thread, as users write them."""

    def batch_end(self, state: Any, logger: Any) -> None:
        print(f"thread says {int(state.timer.batch)}")

    async def after_forward(self, state: Any, logger: Any) -> None:
        print("loop says", int(state.timer.batch))


def test_print_from_handlers_does_not_break_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Terminal()  # one terminal: the bar and sys.stdout both write to it
    monkeypatch.setattr(sys, "stdout", out)
    make_trainer(4, 2, callbacks=[Printer()], loggers=[ProgressBar(stream=out)]).fit_sync()
    assert sys.stdout is out  # given back at close
    text = out.getvalue()
    said = [m.start() for m in re.finditer(r"(thread|loop) says \d+\n", text)]
    assert len(said) == 16  # every line printed once, whole
    # Each printed line starts a line: the bar was cleared (or ended) before it.
    assert all(start == 0 or text[start - 1] in "\r\n" for start in said), text
    final = [chunk for chunk in re.split(r"[\r\n]", text) if "100%" in chunk]
    assert any(c.startswith("Epoch 2/2: 100%") and "4/4" in c for c in final)


def test_print_is_left_alone_without_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    out, seen = Pipe(), []

    class Where(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            seen.append(sys.stdout)

    monkeypatch.setattr(sys, "stdout", out)
    make_trainer(2, callbacks=[Where()], loggers=[ProgressBar(stream=out)]).fit_sync()
    assert seen == [out, out]


def test_stdout_is_given_back_when_training_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)

    class Boom(Callback):
        def batch_end(self, state: Any, logger: Any) -> None:
            print("about to fail", end="")  # a partial line: written at close
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        make_trainer(4, callbacks=[Boom()], loggers=[ProgressBar(stream=out)]).fit_sync()
    assert sys.stdout is out
    assert "about to fail" in out.getvalue()


def test_the_next_batch_does_not_wait_for_the_bar() -> None:
    """The bar's ``batch_checkpoint`` is ``@trailing(2)``: while its line for batch 1 is held
    (a terminal that blocks), the training thread starts batch 2 and passes its live fence.
    Regression: the fence waited for the bar at every batch."""
    from trainbus import blocking

    started_batch_2 = threading.Event()

    class HeldPipe(Pipe):
        released_by_training = False

        def write(self, s: str) -> int:
            if "batch 1/" in s:  # held until the training thread is inside batch 2
                HeldPipe.released_by_training = started_batch_2.wait(timeout=60)
            return super().write(s)

    class Watch(Callback):
        @blocking
        def before_forward(self, state: Any, logger: Any) -> None:
            if int(state.timestamp.batch) == 1:  # batch 2, past its live fence
                started_batch_2.set()

    out = HeldPipe()
    trainer = make_trainer(3, 1, [Watch()], loggers=[ProgressBar(stream=out, interval="1ba")],
                           progress=False)
    trainer.fit_sync()
    assert HeldPipe.released_by_training, "batch 2 waited for the bar's line of batch 1"
    assert "batch 3/3" in out.getvalue()
