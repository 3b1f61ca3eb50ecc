"""Synthetic values shaped like a training run's, for :mod:`bench.storage_size`: float32
losses and norms, a float64 learning-rate schedule, a wall clock at :data:`STEP_S` a step,
near-constant memory counters, and :data:`LAYERS` layer norms a step."""

from __future__ import annotations

from typing import Any

import numpy as np

LAYERS = 256
STEP_S = 0.025
"""The synthetic run's clock: a step every 25 ms (its ``time`` values, and autovacuum's)."""


def step_points(job_id: str, first: int, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    steps = np.arange(first, first + n)
    loss = (2.0 * np.exp(-steps / 3e5) + rng.normal(0, 0.05, n)).astype(np.float32)
    grad = np.abs(rng.normal(1.0, 0.3, n)).astype(np.float32)
    lr = 1e-3 * 0.5 * (1 + np.cos(np.pi * steps / 2e6))
    rate = 1000.0 + rng.normal(0, 15, n)
    ms = 25.0 + rng.normal(0, 0.5, n)
    skipped = rng.random(n) < 0.001
    out = []
    for i, step in enumerate(steps.tolist()):
        out.append(
            {
                "job_id": job_id,
                "attempt": 1,
                "step": step,
                "time": 1.7e9 + step * STEP_S,
                "loss": float(loss[i]),
                "loss_scale": 65536.0,
                "skipped": bool(skipped[i]),
                "grad_norm": float(grad[i]),
                "lr": float(lr[i]),
                "memory_allocated": 1_234_567_168,
                "memory_reserved": 2_147_483_648,
                "memory_peak": 1_734_567_168,
                "samples_per_second": float(rate[i]),
                "step_time_ms": float(ms[i]),
                "skipped_steps": int(step // 1000),
                "world_size": None,
                "memory_peak_per_rank": None,
                # The stream cursor, as the recorder's points carry it (its chunks keep it).
                "stream_ms": 1_700_000_000_000 + step * 25,
                "stream_seq": 0,
            }
        )
    return out


def layer_values(job_id: str, first: int, n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    norms = np.abs(rng.normal(0.1, 0.03, (n, LAYERS))).astype(np.float32)
    return [
        {
            "job_id": job_id,
            "attempt": 1,
            "step": first + i,
            "kind": "layer_grad_norm",
            "name": f"blocks.{k // 2}.{'weight' if k % 2 == 0 else 'bias'}",
            "value": float(norms[i, k]),
            "time": 1.7e9 + (first + i) * STEP_S,
            "stream_ms": 1_700_000_000_000 + first + i,
            "stream_seq": 0,
        }
        for i in range(n)
        for k in range(LAYERS)
    ]
