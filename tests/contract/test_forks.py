"""A fork's spec: the parent's with overrides merged in and validated whole; the model, the
dataset and the data position's fields are refused by name, unknown fields too."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from amptrain.contract.forks import (
    MAX_OVERRIDE_BYTES,
    ForkRefused,
    ForkRequest,
    fork_spec,
)
from amptrain.contract.spec import JobSpec
from tests.support.specs import service_job

PARENT = JobSpec.model_validate(service_job(max_steps=30)).model_dump(mode="json")


def fields(request: dict[str, Any]) -> list[tuple[str, ...]]:
    with pytest.raises(ForkRefused) as refused:
        fork_spec(PARENT, ForkRequest.model_validate(request))
    return [tuple(str(p) for p in problem["loc"]) for problem in refused.value.problems]


def test_overrides_merge_field_by_field_and_keep_the_rest() -> None:
    request = ForkRequest(step=10, overrides={"optimizer": {"lr": 5e-4}, "max_steps": 40})
    spec = fork_spec(PARENT, request)
    assert spec.optimizer.lr == 5e-4 and spec.optimizer.name == "adamw"
    assert spec.max_steps == 40 and spec.batch_size == 32 and spec.name == "mlp-fp32@10"
    assert spec.checkpoint.every_steps == 10  # the parent's, not the default
    assert fork_spec(PARENT, ForkRequest(step=10, name="half-lr")).name == "half-lr"


@pytest.mark.parametrize(
    "field", ["model", "dataset", "batch_size", "seed", "devices", "weights", "name"]
)
def test_what_the_checkpoint_depends_on_is_refused_by_name(field: str) -> None:
    assert fields({"step": 10, "overrides": {field: PARENT.get(field)}}) == [("overrides", field)]


def test_unknown_fields_and_bad_values_are_named_under_overrides() -> None:
    assert fields({"step": 1, "overrides": {"max_step": 3}}) == [("overrides", "max_step")]
    assert fields({"step": 1, "overrides": {"optimizer": {"lr": -1}}}) == [
        ("overrides", "optimizer", "lr")
    ]
    assert fields({"step": 1, "overrides": {"optimizer": {"lrr": 1}}}) == [
        ("overrides", "optimizer", "lrr")
    ]


def test_max_steps_must_exceed_the_fork_step() -> None:
    assert fields({"step": 10, "overrides": {"max_steps": 10}}) == [("overrides", "max_steps")]
    assert fields({"step": 30}) == [("step",)]  # the parent's 30 is no step beyond 30


@pytest.mark.parametrize(
    "request_body",
    [
        {"step": -1},
        {"step": 10**12},
        {"step": "5"},
        {"step": 5.0},
        {"step": True},
        {"step": 5, "overrides": {"health": {"spike": {"a": {"b": {"c": 1}}}}}},
        {"step": 5, "overrides": {"optimizer": {"lr": "x" * MAX_OVERRIDE_BYTES}}},
        {"step": 5, "overrides": []},
        {"step": 5, "extra": 1},
    ],
)
def test_hostile_requests_are_refused(request_body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ForkRequest.model_validate(request_body)
