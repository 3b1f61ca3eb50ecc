"""Which precision a job runs in, and why.

The policy (issue 2): ``auto`` picks bf16 on CUDA devices of compute capability
>= 8.0 (native bf16 tensor cores), fp16 + GradScaler on 7.x (fp16 tensor cores
but no bf16), fp32 below 7.0, and fp32 on CPUs unless they have AMX.
``torch.cuda.is_bf16_supported()`` is deliberately not consulted on its own: it
returns True on V100/T4 because it counts emulation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import torch

from trainer_core.contract.errors import InvalidSpecError

Effective = Literal["fp32", "fp16", "bf16"]

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision asked for, the one used, the reason, and the device it was decided for."""

    requested: str
    effective: Effective
    reason: str
    device: str

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None when autocast stays off (fp32)."""
        return AUTOCAST_DTYPES[self.effective]

    @property
    def uses_scaler(self) -> bool:
        """Only fp16 needs loss scaling; bf16 has fp32's exponent range."""
        return self.effective == "fp16"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def cpu_has_amx() -> bool:
    """True when the CPU has AMX-BF16 tiles (Sapphire Rapids and later).

    ``torch.backends.cpu.get_cpu_capability()`` only reports the vector ISA
    (``AVX2``/``AVX512``), never AMX, so we read the ``amx_bf16`` flag from
    /proc/cpuinfo (Linux) and fall back to ``torch.cpu._is_amx_tile_supported``
    (private, hence the guard) where that file does not exist.
    """
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return "amx_bf16" in line.split()
        return False
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe else False


def resolve_device(kind: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without CUDA is a spec error."""
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise InvalidSpecError("device: 'cuda' requested but this worker has no CUDA device")
    return torch.device(kind)


def choose_precision(requested: str, device: torch.device) -> PrecisionChoice:
    """Apply the precision policy; raises InvalidSpecError for bf16 on a GPU without it."""
    if device.type == "cuda":
        return _choose_cuda(requested, device)
    return _choose_cpu(requested, device)


def _choose_cuda(requested: str, device: torch.device) -> PrecisionChoice:
    major, minor = torch.cuda.get_device_capability(device)
    cap = f"{major}.{minor}"
    name = f"cuda ({torch.cuda.get_device_name(device)}, capability {cap})"
    if requested == "auto":
        if major >= 8:
            return PrecisionChoice(
                requested, "bf16", f"capability {cap} >= 8.0 has native bf16", name
            )
        if major == 7:
            return PrecisionChoice(
                requested, "fp16", f"capability {cap}: fp16 tensor cores, no native bf16", name
            )
        return PrecisionChoice(requested, "fp32", f"capability {cap} < 7.0: no tensor cores", name)
    if requested == "bf16" and major < 8:
        raise InvalidSpecError(
            f"precision: bf16 needs CUDA compute capability >= 8.0 but this GPU has {cap} "
            "(torch.cuda.is_bf16_supported() counts slow emulation); use 'fp16' or 'auto'"
        )
    return PrecisionChoice(requested, _effective(requested), "requested explicitly", name)


def _choose_cpu(requested: str, device: torch.device) -> PrecisionChoice:
    amx = cpu_has_amx()
    if requested == "auto":
        if amx:
            return PrecisionChoice(requested, "bf16", "CPU has AMX-BF16", "cpu")
        return PrecisionChoice(
            requested, "fp32", "CPU without AMX: bf16 autocast would be no faster than fp32", "cpu"
        )
    reason = "requested explicitly"
    if requested in ("bf16", "fp16") and not amx:
        # Correct but emulated: allowed (tests and debugging rely on it), just slow.
        reason += "; this CPU has no AMX, so low precision runs emulated (often slower than fp32)"
    return PrecisionChoice(requested, _effective(requested), reason, "cpu")


def _effective(requested: str) -> Effective:
    if requested not in AUTOCAST_DTYPES:
        raise InvalidSpecError(
            f"precision: unknown value {requested!r}; allowed: auto, fp32, fp16, bf16"
        )
    return requested  # type: ignore[return-value]


_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


@contextlib.contextmanager
def fp32_island() -> Iterator[None]:
    """Run numerically fragile code (KL divergence, logs of probabilities) in fp32.

    Disables autocast for every device type where it is currently on. Autocast
    only decides the dtype of the ops it intercepts, so callers must also cast
    their low-precision inputs with ``.float()`` inside the island. The engine
    computes every loss inside one.
    """
    with contextlib.ExitStack() as stack:
        for device_type in _AUTOCAST_DEVICE_TYPES:
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield
