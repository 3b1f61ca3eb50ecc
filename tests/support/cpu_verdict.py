"""What ``precision: auto`` should pick on a CPU, worked out from a capability report's CPU
entry (its flags and its bf16 probe), so a test holds on any CPU."""

from __future__ import annotations

import re
from typing import Any

from trainer_core.engine.cpu_probe import BF16_MIN_SPEEDUP

_MEASURED = re.compile(r"bf16 measured (\d+(?:\.\d+)?)x fp32")


def expected_cpu_auto(cpu: dict[str, Any], reason: str | None = None) -> str:
    """AMX always takes bf16; AVX512-BF16 takes it only when the probe measured it paying off.

    The probe is timed, so two processes on a busy machine can measure differently: for a
    job, pass its ``precision.reason`` and the verdict is checked against the measurement the
    job itself made (which the reason names) instead of the report's.
    """
    if cpu["amx"]:
        return "bf16"
    if cpu["avx512_bf16"]:
        probe = cpu["bf16_probe"]
        speedup = probe["fp32_ms"] / probe["bf16_ms"]
        if reason is not None:
            found = _MEASURED.search(reason)
            assert found, f"the reason does not name the measurement: {reason!r}"
            speedup = float(found[1])
        return "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    return "fp32"
