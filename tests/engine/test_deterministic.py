"""``deterministic: true`` on a CPU: the run trains under torch's deterministic mode and puts
the process-wide switches back as they were, after a failure too; an op without a
deterministic implementation fails the job as ``invalid_spec`` naming the option and the op
(in the worker's classification and in ``amptrain train``); the worker's training process
gets cuBLAS's workspace setting; a resumed run equals an uninterrupted one bit for bit.
(On CUDA, with cuDNN and cuBLAS: ``tests/engine/test_gpu.py``.)"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

import amptrain.engine
from amptrain.cli import train as cli_train
from amptrain.components.base import DataInfo
from amptrain.contract.errors import classify_failure
from amptrain.contract.spec import parse_spec
from amptrain.engine import Components, RunContext, Trainer
from amptrain.worker.child.main import add_deterministic_env, train
from amptrain.worker.child.protocol import Finished, Launch
from tests.engine import deterministic_resume


class Vectors:
    info = DataInfo("classification", (4,), 2)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(start, start + size)
        return torch.cos(idx[:, None] * torch.ones(1, 4)), idx % 2


class Watching(torch.nn.Module):
    """Records, at every forward, whether torch's deterministic mode is on; with ``put``, it
    also calls ``Tensor.put_``, which torch has no deterministic implementation of."""

    def __init__(self, put: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.put = put
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.are_deterministic_algorithms_enabled())
        if self.put:
            torch.zeros(2).put_(torch.tensor([0]), torch.ones(1))
        return self.fc(x)


def job(deterministic: bool, **overrides: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": 3,
            "batch_size": 4,
            "device": "cpu",
            "precision": "fp32",
            "deterministic": deterministic,
            **overrides,
        }
    )


def parts(model: Watching) -> Components:
    return Components(model, Vectors(), torch.nn.functional.cross_entropy)


@pytest.fixture
def switches() -> Iterator[None]:
    """Puts back whatever a failing test leaves on (the switches are process-wide)."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


def mode() -> tuple[bool, bool]:
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


@pytest.mark.usefixtures("switches")
@pytest.mark.parametrize("before", [(False, False), (True, True)])
def test_a_deterministic_run_trains_in_deterministic_mode_and_puts_the_switches_back(
    before: tuple[bool, bool],
) -> None:
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    model = Watching()
    Trainer(job(True), RunContext(None), parts(model)).train()
    assert model.seen and all(model.seen)
    assert mode() == before  # warn_only included: True, as it was, not the run's False


@pytest.mark.usefixtures("switches")
def test_a_run_without_the_option_leaves_deterministic_mode_as_it_found_it() -> None:
    model = Watching()
    Trainer(job(False), RunContext(None), parts(model)).train()
    assert model.seen and not any(model.seen) and mode() == (False, False)


@pytest.mark.usefixtures("switches")
def test_an_op_without_a_deterministic_implementation_fails_naming_the_option_and_the_op() -> None:
    Trainer(job(False), RunContext(None), parts(Watching(put=True))).train()  # the control
    with pytest.raises(RuntimeError) as info:
        Trainer(job(True), RunContext(None), parts(Watching(put=True))).train()
    assert mode() == (False, False)  # put back after the failure too
    error = classify_failure(info.value)
    assert (error.code, error.retryable) == ("invalid_spec", False)
    assert error.message.startswith("deterministic: put_ has no deterministic implementation")


@pytest.mark.usefixtures("switches")
def test_amptrain_train_shows_the_same_error_not_internal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def with_put(spec: Any, ctx: RunContext) -> Trainer:
        return Trainer(spec, ctx, parts(Watching(put=True)))

    monkeypatch.setattr(amptrain.engine, "Trainer", with_put)
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    status = cli_train.run(job(True), io.StringIO(), console, None, (), resume=False)
    assert status == cli_train.EXIT_FAILED
    assert "error [invalid_spec]: deterministic: put_ has no deterministic" in shown.getvalue()


def test_the_training_process_of_a_deterministic_job_gets_the_cublas_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after the test

    def launch(deterministic: bool) -> Launch:
        spec = job(deterministic).model_dump(mode="json")
        ckpt = str(tmp_path / str(deterministic))
        return Launch(job_id="j_1", attempt=1, spec=spec, checkpoint_dir=ckpt, redis_url="")

    assert isinstance(train(launch(False), None), Finished)
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    outcome = train(launch(True), None)
    assert isinstance(outcome, Finished), outcome
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert mode() == (False, False)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, ":4096:8"),
        (":4096:2:16:8", ":4096:8"),  # PyTorch's default workspace is not reproducible
        (":16:8", ":16:8"),  # the operator's smaller deterministic workspace is kept
    ],
)
def test_the_cublas_setting_keeps_an_operators_deterministic_choice(
    before: str | None, after: str
) -> None:
    env = {"PATH": "/bin"} | ({"CUBLAS_WORKSPACE_CONFIG": before} if before else {})
    add_deterministic_env(env)
    assert env == {"PATH": "/bin", "CUBLAS_WORKSPACE_CONFIG": after}


@pytest.mark.heavy  # six short runs: ~3 s alone
@pytest.mark.usefixtures("switches")
def test_a_resumed_deterministic_run_equals_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    # The same check the GPU test runs in a fresh CUDA process; on a CPU it holds without the
    # option too, so this pins that the option keeps resume exact and the check itself works.
    found = deterministic_resume.differences(tmp_path, "cpu", "fp32")
    assert found == {job: [] for job in deterministic_resume.JOBS}
