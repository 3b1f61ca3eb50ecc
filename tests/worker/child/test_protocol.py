"""The control protocol between a supervisor and its training child: typed both ways."""

from __future__ import annotations

import pytest

from amptrain.worker.child.protocol import (
    Failed,
    Finished,
    Launch,
    PrecisionChosen,
    ProtocolError,
    decode,
    encode,
)


@pytest.mark.parametrize(
    "message",
    [
        PrecisionChosen(requested="auto", effective="bf16", reason="cc 9.0", device="H100"),
        Finished(final_step=100, resumed_from=40, skipped_steps=2, dropped_records=0),
        Failed(code="diverged", message="loss is NaN at step 7", step=7, retryable=False),
    ],
)
def test_every_message_survives_the_pipe(message: PrecisionChosen | Finished | Failed) -> None:
    line = encode(message)
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert decode(line) == message


@pytest.mark.parametrize(
    ("line", "names"),
    [
        ('{"type": "result", "final_step": "many"}', "final_step"),
        ('{"type": "error", "code": "x", "message": "m", "step": null}', "retryable"),
        ('{"type": "hello"}', "hello"),
        (
            '{"type": "result", "final_step": 1, "resumed_from": null, "skipped_steps": 0, '
            '"dropped_records": 0, "extra": 1}',
            "extra",
        ),
        ("not json", "not json"),
    ],
)
def test_a_bad_line_is_refused_naming_what_is_wrong(line: str, names: str) -> None:
    with pytest.raises(ProtocolError, match=names):
        decode(line)


def test_precision_reason_names_its_device_and_the_event_keeps_every_field() -> None:
    on_gpu = PrecisionChosen(requested="auto", effective="fp16", reason="cc 7.0", device="V100")
    assert on_gpu.reason_on_device == "cc 7.0; device: V100"
    assert PrecisionChosen(requested="fp32", effective="fp32", reason="asked").reason_on_device == (
        "asked"
    )
    assert on_gpu.event_data() == {
        "requested": "auto",
        "effective": "fp16",
        "reason": "cc 7.0",
        "device": "V100",
    }


def test_launch_round_trips_as_json() -> None:
    launch = Launch(
        job_id="j_" + "0" * 32,
        attempt=2,
        spec={"model": {"name": "mlp"}},
        checkpoint_dir="/ckpt/j",
        redis_url="redis://127.0.0.1:6379/0",
        data_roots=["/data"],
    )
    assert Launch.model_validate_json(launch.model_dump_json()) == launch
