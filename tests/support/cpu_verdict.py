"""What ``precision: auto`` should pick on a CPU, so a test holds on any CPU.

A job decides ``auto`` by measuring its own model (:mod:`amptrain.engine.auto_precision`):
:func:`expected_measured` works out the verdict from the measurement the job's precision
reason reports. The capability rule, :func:`expected_cpu_auto`, is what a worker's report
shows and what a job falls back to when its model cannot be measured.
"""

from __future__ import annotations

import re
from typing import Any

from amptrain.engine.auto_precision import MIN_SPEEDUP
from amptrain.engine.cpu_probe import BF16_MIN_SPEEDUP

MEASURED = re.compile(
    r"^(?P<candidate>bf16|fp16) (?P<ratio>\d+\.\d+)x (?P<baseline>fp32|tf32) measured over "
    r"(?P<steps>\d+) steps in (?P<seconds>\d+\.\d+) s(?P<note> \([^)]*\))?: (?P<effective>\w+)"
)


def measured(reason: str) -> dict[str, Any]:
    """The measurement a precision reason names (fails the test when it names none)."""
    found = MEASURED.match(reason)
    assert found, f"no measured ratio in the precision reason {reason!r}"
    return found.groupdict()


def expected_measured(precision: dict[str, Any]) -> str:
    """The verdict a job's ``precision`` (as ``GET /jobs/{id}`` or its event shows it) must
    carry, given the ratio its own reason reports: the low precision only when it measured
    at least MIN_SPEEDUP faster with a finite loss (the reason says when it was not)."""
    got = measured(precision["reason"])
    ratio = float(got["ratio"])  # two digits: the decision used the exact ratio
    finite = "not finite" not in (got["note"] or "")
    if abs(ratio - MIN_SPEEDUP) < 0.01:
        return str(precision["effective"])  # too close to call from the rounded figure
    return got["candidate"] if finite and ratio >= MIN_SPEEDUP else got["baseline"]


def expected_cpu_auto(cpu: dict[str, Any]) -> str:
    """The capability rule, from a capability report's CPU entry (its flags and its bf16
    probe): AMX always takes bf16; AVX512-BF16 takes it only when the probe measured it
    paying off. A report's ``auto_precision`` shows this rule: the fallback of its jobs."""
    if cpu["amx"]:
        return "bf16"
    if cpu["avx512_bf16"]:
        probe = cpu["bf16_probe"]
        speedup = probe["fp32_ms"] / probe["bf16_ms"]
        return "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    return "fp32"
