"""The capability probe's CPU entry: the bf16 flags, the measured bf16-vs-fp32 probe, and an
``auto`` verdict that follows from them and names the measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.cpu_verdict import expected_cpu_auto


def test_the_cpu_entry_reports_flags_the_probe_and_a_verdict_that_follows_from_them() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "amptrain.worker.child.probe"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        check=True,
    )
    (cpu,) = json.loads(proc.stdout)["devices"]
    assert isinstance(cpu["amx"], bool) and isinstance(cpu["avx512_bf16"], bool) and cpu["isa"]
    probe = cpu["bf16_probe"]
    assert probe["fp32_ms"] > 0 and probe["bf16_ms"] > 0 and probe["threads"] >= 1
    assert abs(probe["speedup"] - probe["fp32_ms"] / probe["bf16_ms"]) < 1e-3
    auto = cpu["auto_precision"]
    if not cpu["amx"] and cpu["avx512_bf16"]:
        # The reason names the measurement the verdict came from.
        assert f"bf16 measured {probe['fp32_ms'] / probe['bf16_ms']:.2f}x fp32" in auto["reason"]
    assert auto["effective"] == expected_cpu_auto(cpu) and "CPU" in auto["reason"]
