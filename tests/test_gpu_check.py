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
    assert "time account and default output: PASS" in out


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


def _ddp_plan(cpu: bool, gpus: int) -> list[str]:
    spec = importlib.util.spec_from_file_location("ddp_check", SCRIPT.with_name("ddp_check.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [check.title for check in module.plan(cpu, gpus)]


def test_ddp_with_one_gpu_runs_two_ranks_on_it_over_gloo_and_one_over_nccl() -> None:
    assert _ddp_plan(cpu=False, gpus=1) == [
        "DDP, 2 ranks both on cuda:0 over gloo (NCCL needs a GPU per rank)",
        "DDP, 1 rank on cuda:0 over NCCL (a real NCCL group, DDP on the GPU)",
        "FSDP, 1 rank on cuda:0 (cpu:gloo,cuda:nccl)",
    ]
    assert _ddp_plan(cpu=False, gpus=2) == [
        "DDP, 2 ranks on cuda:0 and cuda:1 (cpu:gloo,cuda:nccl)",
        "FSDP, 2 ranks on cuda:0 and cuda:1 (cpu:gloo,cuda:nccl)",
    ]
    assert _ddp_plan(cpu=True, gpus=0) == [
        "DDP, 2 ranks on the CPU (gloo)",
        "FSDP, 2 ranks on the CPU (gloo)",
    ]
