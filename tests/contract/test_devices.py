"""The spec's data-parallel fields: ``devices`` splits the global batch, and what cannot be
split evenly (or shrunk on one rank alone) is refused with a message naming the fields."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from amptrain.contract.limits import spec_limits
from amptrain.contract.spec import parse_spec

BASE: dict[str, Any] = {
    "model": {"name": "mlp"},
    "dataset": {"name": "synthetic-classification"},
    "max_steps": 10,
}


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as info:
        parse_spec({**BASE, **fields})
    return str(info.value)


def test_each_device_takes_an_equal_share_of_the_global_batch() -> None:
    spec = parse_spec({**BASE, "batch_size": 96, "grad_accum_steps": 3, "devices": 4})
    assert spec.micro_batch_size == 8  # 96 = 8 x 3 accumulation steps x 4 devices
    single = parse_spec(BASE)
    assert (single.devices, single.collective_timeout_s) == (1, 600)
    assert single.micro_batch_size == single.batch_size


def test_a_batch_that_does_not_split_evenly_is_refused_naming_the_fields() -> None:
    message = refusal(batch_size=64, grad_accum_steps=2, devices=3)
    assert "batch_size (64) must be divisible by devices x grad_accum_steps (3 x 2 = 6)" in message
    # One device: the message it always gave.
    assert "grad_accum_steps (3) must divide batch_size (64)" in refusal(
        batch_size=64, grad_accum_steps=3
    )


def test_auto_micro_batch_with_several_devices_is_refused_saying_why() -> None:
    message = refusal(devices=2, auto_micro_batch=True)
    assert "auto_micro_batch needs devices 1 (got devices 2)" in message
    assert "fall out of step with the others" in message
    assert parse_spec({**BASE, "auto_micro_batch": True}).auto_micro_batch


@pytest.mark.parametrize(
    ("field", "value"),
    [("devices", 0), ("devices", 9), ("collective_timeout_s", 4), ("collective_timeout_s", 3601)],
)
def test_out_of_bounds_is_refused_and_the_bounds_are_listed(field: str, value: int) -> None:
    assert field in refusal(**{field: value})
    limits = spec_limits()
    assert limits["devices"] == {"minimum": 1, "maximum": 8}
    assert limits["collective_timeout_s"] == {"minimum": 5, "maximum": 3600}


def test_fsdp_shards_across_devices_and_is_refused_on_one_naming_the_field() -> None:
    spec = parse_spec({**BASE, "devices": 2, "parallelism": "fsdp"})
    assert (spec.parallelism, spec.activation_checkpointing) == ("fsdp", False)
    assert parse_spec(BASE).parallelism == "ddp"
    message = refusal(parallelism="fsdp")
    assert "parallelism fsdp needs devices > 1 (got devices 1)" in message
    assert "use ddp" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("parallelism", "zero3"),
        ("parallelism", "FSDP"),
        ("parallelism", 1),
        ("parallelism", None),
        ("parallelism", ["fsdp"]),
        ("activation_checkpointing", "yes"),
        ("activation_checkpointing", 1),
        ("activation_checkpointing", "true"),
        ("activation_checkpointing", None),
    ],
)
def test_hostile_sharding_values_are_refused_naming_the_field(field: str, value: Any) -> None:
    message = refusal(devices=2, **{field: value})
    assert message.splitlines()[1] == field  # pydantic's first line under the count: the loc
