"""Keeps ``scripts/gpu_check.py`` from rotting: its CPU dry run and its no-CUDA exit."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load().main(["--cpu", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "plain loop" in out
    assert "with / without callbacks: x" in out
    assert "RESULT: OK" in out


def test_without_cuda_it_says_so_and_exits_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load().main([]) == 0
    assert "gpu_check needs CUDA" in capsys.readouterr().out


def test_ddp_without_cuda_is_skipped_with_a_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _load().main(["--ddp"]) == 0
    assert "gpu_check --ddp skipped: CUDA is not available" in capsys.readouterr().out


def test_ddp_with_one_gpu_is_skipped_with_a_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _load().main(["--ddp"]) == 0
    assert "NCCL needs one GPU per rank and this machine has 1" in capsys.readouterr().out
