"""Golden losses: short fixed-seed CPU runs in fp32, bf16 and fp16 whose per-step losses
are kept in ``tests/engine/golden/<precision>.json``. A numerics change that moves any of
them fails here until the files are regenerated on purpose:

    AMPTRAIN_REGENERATE_GOLDEN=1 pytest tests/engine/test_golden.py -n0

(then review and commit the diff of tests/engine/golden/).

Compared exactly (floats round-trip through JSON), which is stable only for one CPU
kernel set and one thread count, both measured on the 2-core AVX2 machine these were
made on: the same run twice gives bitwise-equal losses; 1 vs 2 intra-op threads moves
fp32 by up to 1.3e-7, fp16 by 2.7e-5 and bf16 by 2.7e-4 (relative, over 20 steps);
``ATEN_CPU_CAPABILITY=default`` vs AVX2 moves them by 1.3e-7, 4.8e-5 and 2.0e-4. So the
runs pin one intra-op thread, and each file keeps one entry per CPU kernel set
(:func:`cpu_signature`: torch's CPU capability plus AMX / AVX512-BF16, which bf16 uses
when present); on a CPU without an entry the test skips saying so, and regenerating there
adds that CPU's entry beside the others. A torch upgrade that changes kernels fails here
too: the message names the torch version the entry was made with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("AMPTRAIN_REGENERATE_GOLDEN") == "1"
SPEC: dict[str, Any] = {
    "model": {"name": "mlp"},
    "dataset": {"name": "synthetic-classification"},
    "max_steps": 20,
    "batch_size": 32,
    "device": "cpu",
    "seed": 7,
    "telemetry": {"flush_every_steps": 20, "flush_every_ms": 600_000},
}


def cpu_signature() -> str:
    """The CPU kernel set a run's numerics depend on, e.g. ``AVX2`` or ``AVX512+amx``."""
    parts = [torch.backends.cpu.get_cpu_capability()]
    if torch.cpu._is_amx_tile_supported():
        parts.append("amx")
    if torch.cpu._is_avx512_bf16_supported():
        parts.append("avx512_bf16")
    return "+".join(parts)


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def losses(precision: str) -> list[float]:
    sink = ListSink()
    Trainer(parse_spec({**SPEC, "precision": precision}), RunContext(None, sink=sink)).train()
    metrics = sink.metrics()
    assert sorted(metrics) == list(range(1, SPEC["max_steps"] + 1))
    return [metrics[s]["loss"] for s in sorted(metrics)]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_fixed_seed_losses_equal_the_golden_file(precision: str) -> None:
    path = GOLDEN / f"{precision}.json"
    kept: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    cpu = cpu_signature()
    got = losses(precision)
    if REGENERATE:
        kept.setdefault("spec", {**SPEC, "precision": precision})
        kept.setdefault("threads", 1)
        kept.setdefault("by_cpu", {})[cpu] = {"torch": torch.__version__, "losses": got}
        path.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
        return
    assert kept.get("spec") == {**SPEC, "precision": precision}, (
        f"{path.name} was made from another spec: regenerate it (see this module's docstring)"
    )
    entry = kept.get("by_cpu", {}).get(cpu)
    if entry is None:
        pytest.skip(
            f"no golden {precision} losses for this CPU ({cpu}; kept: "
            f"{', '.join(kept.get('by_cpu', {})) or 'none'}): bitwise results depend on the CPU "
            "kernels; AMPTRAIN_REGENERATE_GOLDEN=1 adds this CPU's entry"
        )
    assert got == entry["losses"], (
        f"{precision} losses moved from {path.name} (made on {cpu} with torch "
        f"{entry['torch']}, now {torch.__version__}). If the change is meant, regenerate: "
        "AMPTRAIN_REGENERATE_GOLDEN=1 pytest tests/engine/test_golden.py -n0"
    )
