"""What ``precision: auto`` should pick on a CPU, worked out from a capability report's CPU
entry (its flags and its bf16 probe), so a test holds on any CPU."""

from __future__ import annotations

from typing import Any

from amptrain.engine.cpu_probe import BF16_MIN_SPEEDUP


def expected_cpu_auto(cpu: dict[str, Any]) -> str:
    """AMX always takes bf16; AVX512-BF16 takes it only when the probe measured it paying off.

    The worker hands its report's measurement to every job, so a job's verdict is the report's.
    """
    if cpu["amx"]:
        return "bf16"
    if cpu["avx512_bf16"]:
        probe = cpu["bf16_probe"]
        speedup = probe["fp32_ms"] / probe["bf16_ms"]
        return "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    return "fp32"
