"""Job specs the service tests submit: the built-in mlp on synthetic classification, on CPU.

``mlp_job`` is the one builder; each test passes the fields it cares about as
top-level overrides (a given key replaces the default whole). ``service_job`` is
the preset the end-to-end, fault and client-CLI tests share: fast flushes and
frequent checkpoints, so kills and resumes have something to resume from.
"""

from __future__ import annotations

from typing import Any


def mlp_job(max_steps: int = 30, **overrides: Any) -> dict[str, Any]:
    """A JSON job spec for the mlp on synthetic classification on CPU; unset fields take
    JobSpec's defaults."""
    return {
        "model": {"name": "mlp", "args": {}},
        "dataset": {"name": "synthetic-classification", "args": {}},
        "device": "cpu",
        "max_steps": max_steps,
        **overrides,
    }


def service_job(precision: str = "fp32", max_steps: int = 30, **overrides: Any) -> dict[str, Any]:
    """``mlp_job`` named after its precision, batch 32, flushing every 5 steps or 200 ms and
    checkpointing every 10 steps (two kept)."""
    return mlp_job(
        max_steps,
        **{
            "name": f"mlp-{precision}",
            "precision": precision,
            "batch_size": 32,
            "telemetry": {"flush_every_steps": 5, "flush_every_ms": 200},
            "checkpoint": {"every_steps": 10, "keep_last": 2},
            **overrides,
        },
    )
