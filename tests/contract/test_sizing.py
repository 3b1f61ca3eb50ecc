"""The API's torch-free size estimate: exact parameter counts (checked against the real
models built on the meta device), dataset footprints, and the 422 it drives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from amptrain.components import registry
from amptrain.contract import sizing
from amptrain.contract.admission import (
    ServicePolicy,
    WorkerMemory,
    admission_problems,
    spec_size,
)
from amptrain.contract.catalog import builtins
from amptrain.contract.spec import ComponentRef, parse_spec

GIB = 2**30


def _spec(model: dict[str, Any], dataset: dict[str, Any], **extra: Any) -> Any:
    return parse_spec({"model": model, "dataset": dataset, "max_steps": 1, **extra})


CASES = [
    ({"name": "mlp"}, {"name": "synthetic-classification"}),
    ({"name": "mlp", "args": {"width": 77, "depth": 5}}, {"name": "synthetic-images"}),
    (
        {"name": "mlp", "args": {"width": 3, "depth": 1}},
        {"name": "synthetic-classification", "args": {"features": 5, "classes": 7}},
    ),
    ({"name": "cnn"}, {"name": "synthetic-images"}),
    (
        {"name": "cnn", "args": {"width": 8, "depth": 8}},
        {"name": "synthetic-images", "args": {"channels": 1, "height": 64, "width": 40}},
    ),
    ({"name": "cnn", "args": {"width": 5, "depth": 1}}, {"name": "synthetic-images"}),
    ({"name": "transformer"}, {"name": "synthetic-text"}),
    (
        {
            "name": "transformer",
            "args": {"d_model": 96, "n_layers": 3, "n_heads": 3, "mlp_ratio": 2},
        },
        {"name": "synthetic-text", "args": {"vocab_size": 1000, "seq_len": 77}},
    ),
    ({"name": "resnet50"}, {"name": "synthetic-images", "args": {"classes": 37}}),
]


@pytest.mark.parametrize(("model", "dataset"), CASES)
def test_parameter_formulas_match_the_real_models(
    model: dict[str, Any], dataset: dict[str, Any]
) -> None:
    spec = _spec(model, dataset)
    size = spec_size(spec)
    assert size is not None and size.parameters is not None
    data = builtins("dataset")[dataset["name"]]
    assert data.footprint is not None
    shape = data.footprint(data.with_defaults(spec.dataset.args))
    from amptrain.components.base import DataInfo

    task = "language_model" if dataset["name"] == "synthetic-text" else "classification"
    with torch.device("meta"):
        real = registry.build_model(
            ComponentRef(**model), DataInfo(task, shape.input_shape, shape.classes)
        )
    assert size.parameters == sum(p.numel() for p in real.parameters())
    assert size.state_bytes == size.parameters * 16  # fp32 weights + grads + two AdamW moments


@pytest.mark.parametrize(
    "dataset",
    [
        {"name": "synthetic-classification", "args": {"num_samples": 3000, "features": 40}},
        {"name": "synthetic-text", "args": {"num_samples": 500, "vocab_size": 300}},
        {"name": "synthetic-images", "args": {"height": 48, "width": 40, "classes": 12}},
    ],
)
def test_dataset_footprints_are_the_right_size(dataset: dict[str, Any]) -> None:
    """Within a factor of four of the tensors the built dataset really holds (the estimate
    also counts what building it needs on the way)."""
    spec = _spec({"name": "mlp"}, dataset)
    size = spec_size(spec)
    assert size is not None
    built = registry.build_dataset(spec.dataset, seed=0)
    held = sum(
        t.numel() * t.element_size() for t in vars(built).values() if isinstance(t, torch.Tensor)
    )
    assert held <= size.data_bytes <= 4 * held + 2**25


def test_a_model_too_large_for_the_service_is_a_422_naming_the_estimate() -> None:
    policy = ServicePolicy(max_job_memory_bytes=256 * GIB)
    huge = _spec(
        {"name": "mlp", "args": {"width": 65536, "depth": 64}}, {"name": "synthetic-images"}
    )
    (problem,) = admission_problems(huge, "alice", policy)
    assert problem["loc"] == ["model", "args"]
    assert "too large" in problem["msg"] and "256.0 GiB" in problem["msg"]
    assert "parameters need" in problem["msg"] and "TiB" in problem["msg"]
    ok = _spec({"name": "mlp", "args": {"width": 4096, "depth": 8}}, {"name": "synthetic-images"})
    assert admission_problems(ok, "alice", policy) == []


def test_a_dataset_too_large_for_the_service_names_the_dataset() -> None:
    policy = ServicePolicy(max_job_memory_bytes=64 * GIB)
    big = _spec(
        {"name": "transformer"},
        {"name": "synthetic-text", "args": {"vocab_size": 32768, "num_samples": 10_000_000}},
    )
    (problem,) = admission_problems(big, "alice", policy)
    assert problem["loc"] == ["dataset", "args"] and "the dataset holds about" in problem["msg"]


def test_no_limit_of_its_own_but_what_the_workers_have() -> None:
    """The issue's probe: 185 GiB of synthetic data was accepted on a 23.5 GiB machine,
    because the service's limit was a fixed 256 GiB whatever the machine."""
    huge = _spec(
        {"name": "mlp"},
        {"name": "synthetic-classification", "args": {"features": 16384, "num_samples": 10**6}},
    )
    assert admission_problems(huge, "alice", ServicePolicy()) == []  # nothing known yet
    workers = [WorkerMemory(int(20.4 * GIB), gpu=False), WorkerMemory(int(9.5 * GIB), gpu=True)]
    (problem,) = admission_problems(huge, "alice", ServicePolicy(workers=workers))
    assert problem["loc"] == ["dataset", "args"] and problem["type"] == "too_large"
    assert "needs about 208.0 GiB of host memory" in problem["msg"]  # the smaller need
    assert "at most 20.4 GiB available" in problem["msg"]
    fits = _spec({"name": "mlp"}, {"name": "synthetic-classification"})
    assert admission_problems(fits, "alice", ServicePolicy(workers=workers)) == []


def test_unknown_sizes_are_not_guessed() -> None:
    files = _spec({"name": "mlp"}, {"name": "tensors", "args": {"path": "x.npz"}})
    assert spec_size(files) is None
    policy = ServicePolicy(data_roots=("/srv",), max_job_memory_bytes=1)
    assert admission_problems(files, "alice", policy) == []


def test_runtime_beyond_the_service_limit_is_refused() -> None:
    policy = ServicePolicy(runtime_limit_s=3600)
    spec = _spec({"name": "mlp"}, {"name": "synthetic-classification"}, max_runtime_s=7200)
    (problem,) = admission_problems(spec, "alice", policy)
    assert problem["loc"] == ["max_runtime_s"] and "at most 3600 seconds" in problem["msg"]
    fine = _spec({"name": "mlp"}, {"name": "synthetic-classification"}, max_runtime_s=3600)
    assert admission_problems(fine, "alice", policy) == []


def test_state_bytes_follow_the_optimizer() -> None:
    assert sizing.training_state_bytes(10, "adamw") == 160
    assert sizing.training_state_bytes(10, "sgd", momentum=0.9) == 120
    assert sizing.training_state_bytes(10, "sgd", momentum=0.0) == 80
