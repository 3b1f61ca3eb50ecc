"""The mixed-precision training engine (fp32, bf16, fp16 + loss scaling).

Usage::

    from amptrain.engine import Trainer, RunContext
    result = Trainer(spec, RunContext(checkpoint_dir="/ckpt/job-1", sink=sink)).train()
"""

from amptrain.engine.context import Components, RunContext, TrainResult
from amptrain.engine.loop import Trainer
from amptrain.engine.precision import PrecisionChoice, choose_precision, fp32_island

__all__ = [
    "Components",
    "PrecisionChoice",
    "RunContext",
    "TrainResult",
    "Trainer",
    "choose_precision",
    "fp32_island",
]
