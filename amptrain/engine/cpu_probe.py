"""What this CPU offers for bf16, and a short measurement of whether bf16 autocast pays here.

AMX tiles make bf16 several times faster than fp32; ``avx512_bf16`` alone may or may not
(a small CNN ran 3.3x faster on one such CPU and 0.8x on another); without either,
bf16 is emulated (0.15x). So ``precision: auto`` on a CPU with ``avx512_bf16`` but no
AMX decides by :func:`measure_bf16`: a few training steps of a small CNN in fp32 and in
bf16 autocast, interleaved, median of each (about 0.3 s, at most ~0.5 s
after warm-up).

This is the capability rule's probe: a job's ``auto`` measures its own model
(:mod:`amptrain.engine.auto_precision`) and falls back to this rule only when it cannot.

Who measures: the worker's capability report (``amptrain.worker.child.probe``, shown in
``GET /workers``), once when the worker starts; the worker hands that measurement to
every job it runs (``RunContext.cpu_bf16_probe``), so all its jobs decide ``auto`` the
same way and the report shows what they decide. Without one (``amptrain train``, a
report that failed) the training process measures once itself.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BF16_MIN_SPEEDUP = 1.2
"""bf16 must be at least this much faster than fp32 on the probe for ``auto`` to pick it."""

PROBE_WORKLOAD = "small-CNN training step (3 convs + linear, batch 32 of 3x32x32)"


@dataclass(frozen=True)
class CpuFeatures:
    amx: bool
    """AMX-BF16 tiles (Sapphire Rapids and later)."""
    avx512_bf16: bool
    """AVX-512 bf16 dot-product instructions (Cooper Lake, Zen 4 and later)."""
    isa: str
    """The vector ISA PyTorch dispatches to (``AVX2``, ``AVX512``, ...)."""


@dataclass(frozen=True)
class Bf16Probe:
    fp32_ms: float
    bf16_ms: float
    threads: int
    workload: str = PROBE_WORKLOAD

    @property
    def speedup(self) -> float:
        """fp32 step time / bf16 step time: above 1, bf16 is faster."""
        return self.fp32_ms / self.bf16_ms

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "speedup": round(self.speedup, 3)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Bf16Probe:
        """Inverse of :meth:`to_dict` (``speedup`` is derived, so ignored)."""
        return cls(
            fp32_ms=float(data["fp32_ms"]),  # type: ignore[arg-type]
            bf16_ms=float(data["bf16_ms"]),  # type: ignore[arg-type]
            threads=int(data["threads"]),  # type: ignore[call-overload]
            workload=str(data.get("workload", PROBE_WORKLOAD)),
        )

    def describe(self) -> str:
        return (
            f"bf16 measured {self.speedup:.2f}x fp32 on a small-CNN training step "
            f"({self.bf16_ms:.1f} ms vs {self.fp32_ms:.1f} ms, {self.threads} threads)"
        )


@cache
def cpu_features() -> CpuFeatures:
    """The CPU's bf16-relevant flags: /proc/cpuinfo on Linux, PyTorch's own checks elsewhere."""
    flags = _cpuinfo_flags()
    if flags is not None:
        amx, avx512_bf16 = "amx_bf16" in flags, "avx512_bf16" in flags
    else:
        amx = _torch_check("_is_amx_tile_supported")
        avx512_bf16 = _torch_check("_is_avx512_bf16_supported")
    return CpuFeatures(amx, avx512_bf16, torch.backends.cpu.get_cpu_capability())


def cpu_has_amx() -> bool:
    return cpu_features().amx


@cache
def measure_bf16(repeats: int = 5, warmup: int = 1, budget_s: float = 0.5) -> Bf16Probe:
    """Median step time of a small CNN in fp32 and in bf16 autocast, measured interleaved.

    Stops after ``repeats`` timed pairs or once ``budget_s`` has passed (at least one
    pair), so a loaded machine delays a job's start by little. Leaves the global RNG as
    it found it, so a job's seed still decides everything.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _probe_model()
        x, y = torch.randn(32, 3, 32, 32), torch.randint(10, (32,))
        for _ in range(warmup):
            _step(model, x, y, False)
            _step(model, x, y, True)
        times: dict[bool, list[float]] = {False: [], True: []}
        deadline = time.perf_counter() + budget_s
        while len(times[True]) < repeats and (not times[True] or time.perf_counter() < deadline):
            for bf16 in (False, True):
                started = time.perf_counter()
                _step(model, x, y, bf16)
                times[bf16].append(time.perf_counter() - started)
    return Bf16Probe(
        fp32_ms=statistics.median(times[False]) * 1e3,
        bf16_ms=statistics.median(times[True]) * 1e3,
        threads=torch.get_num_threads(),
    )


def _probe_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, bf16: bool) -> None:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    F.cross_entropy(logits.float(), y).backward()


def _cpuinfo_flags() -> set[str] | None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[-1].split())
    return set()


def _torch_check(name: str) -> bool:
    check = getattr(torch.cpu, name, None)  # private in 2.x, hence the guard
    return bool(check()) if check else False
