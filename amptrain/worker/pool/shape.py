"""Does a claimed job fit the pool process that claimed it? Its ``devices`` against the
slot's devices per job (``amptrain worker --devices-per-job``).

Routing by queue keeps the two equal (a ``devices: N`` job goes to ``gpu-xN``, which only
``--devices-per-job N`` workers consume), but a spec naming its own ``queue`` can send a
job anywhere. Such a job fails at once, right after the claim and before any training
process starts, and never comes back: another attempt would land on the same queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amptrain.worker.child.protocol import Failed
from amptrain.worker.pool.slot import PoolSlot

DEVICES_MISMATCH = "devices_mismatch"


@dataclass(frozen=True)
class Mismatch:
    """The failure to record and the event that names both numbers."""

    failure: Failed
    event: dict[str, Any]


def devices_mismatch(spec: dict[str, Any], slot: PoolSlot, worker: str) -> Mismatch | None:
    """None when the job's ``devices`` is the slot's devices per job, else why not."""
    asked = spec.get("devices", 1)
    if asked == slot.devices_per_job:
        return None
    message = (
        f"the job asks for {asked} device(s) but worker {worker} runs jobs of "
        f"{slot.devices_per_job} device(s) in each pool process (--devices-per-job "
        f"{slot.devices_per_job}); leave the spec's queue unset to route it by its devices "
        "(gpu or cpu for 1, gpu-xN or cpu-xN for N) or name a queue whose workers take "
        f"{asked} device(s) per job"
    )
    return Mismatch(
        Failed(code=DEVICES_MISMATCH, message=message, step=None, retryable=False),
        {
            "job_devices": asked,
            "slot_devices": slot.devices_per_job,
            "worker": worker,
            "slot": slot.index,
            "gpus": list(slot.gpus),
        },
    )
