"""The numerics guardian: decides, after every telemetry flush, what training does next.

:class:`Guardian` (``guardian.py``) runs the checks a careful AMP user runs by hand over the
flushed records and returns one verdict (``verdict.py``: its types and the decision table,
a pure function). Telemetry only reads and publishes; the Trainer acts on the verdict.
"""

from amptrain.engine.guardian.guardian import Guardian, Reading
from amptrain.engine.guardian.verdict import (
    Continue,
    Diverged,
    FallBack,
    RollBack,
    Situation,
    Verdict,
    sooner,
)

__all__ = [
    "Continue",
    "Diverged",
    "FallBack",
    "Guardian",
    "Reading",
    "RollBack",
    "Situation",
    "Verdict",
    "sooner",
]
