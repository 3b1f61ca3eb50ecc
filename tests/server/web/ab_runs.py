"""A precision A/B comparison played by hand: known throughput, memory and loss per
precision, recorded through the real sink and recorder (shared by the API and the
dashboard tests)."""

from __future__ import annotations

from typing import Any

from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack

# Steady-state samples/s, peak memory and loss per precision: fp16 2x and bf16 2.5x as
# fast as fp32, smaller, about as accurate.
RUNS = {
    "fp32": {"samples_per_second": 100.0, "memory_peak": 4000, "loss": 0.50},
    "bf16": {"samples_per_second": 250.0, "memory_peak": 2000, "loss": 0.51},
    "fp16": {"samples_per_second": 200.0, "memory_peak": 2400, "loss": 0.55},
}
# The final evaluation per precision: bf16 keeps fp32's accuracy (-0.2 points, +1% eval
# loss), fp16 does not (-1.5 points, +10%). An earlier one at mid-run (worse) is not final.
EVALS = {
    "fp32": {"accuracy": 0.93, "eval_loss": 0.30},
    "bf16": {"accuracy": 0.928, "eval_loss": 0.303},
    "fp16": {"accuracy": 0.915, "eval_loss": 0.33},
}
STEPS = 50


def spec(**overrides: Any) -> dict[str, Any]:
    # A queue no worker serves: the test plays the worker with a Producer.
    return mlp_job(**{"name": "ab", "max_steps": STEPS, "queue": "gpu-a100", **overrides})


def play(
    stack: Stack,
    job_id: str,
    values: dict[str, float],
    evals: dict[str, float] | None = None,
    precision: str = "fp32",
) -> None:
    """Train ``job_id`` in ``precision`` for STEPS steps: a slow, noisy warm-up (the first
    10% of the steps), then the steady values; the loss ends at ``values["loss"]``. With
    ``evals``: evaluated at mid-run (half as accurate) and after the last step (``evals``)."""
    producer = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job_id)
    try:
        producer.start(precision)
        for step in range(1, STEPS + 1):
            warm = step <= STEPS // 10
            producer.record(
                step,
                loss=values["loss"] + (5.0 if step <= STEPS - 10 else 0.0),
                samples_per_second=1.0 if warm else values["samples_per_second"],
                # 32 samples a step: the time a step of that rate took.
                step_time_ms=32_000 / (1.0 if warm else values["samples_per_second"]),
                memory_peak=int(values["memory_peak"] * step / STEPS),
                skipped=False,
                skipped_steps=0,
            )
            if evals and step in (STEPS // 2, STEPS):
                producer.evals(
                    step, **({k: v / 2 for k, v in evals.items()} if step < STEPS else evals)
                )
        assert producer.sink is not None and producer.sink.flush()
        producer.finish("succeeded", STEPS)
    finally:
        producer.close()
