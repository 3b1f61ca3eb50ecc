"""Which precision a job runs in, why, and the math-mode switches that go with it.

``auto`` is decided by measuring the job's own model
(:mod:`amptrain.engine.auto_precision`, called once the model is built); what this module
decides for it is the capability rule, the fallback when the model cannot be measured
(and what a worker's report shows). The rule: ``auto`` picks bf16 on CUDA devices of compute capability >= 8.0
(native bf16 tensor cores), fp16 + GradScaler on 7.x (fp16 tensor cores but no
bf16), fp32 below 7.0. On a CPU it picks bf16 with AMX, bf16 with ``avx512_bf16``
only when a short measurement shows it at least 1.2x faster than fp32
(:mod:`amptrain.engine.cpu_probe`), fp32 otherwise; never fp16 (no CPU runs it
natively). ``torch.cuda.is_bf16_supported()`` is deliberately not consulted on its
own: it returns True on V100/T4 because it counts emulation.

``fp32`` is strict IEEE fp32 and ``tf32`` is fp32 storage with TF32 tensor-core
matmuls and convolutions (capability >= 8.0). PyTorch's defaults mix the two (cuDNN
convolutions TF32, matmuls IEEE), so :func:`apply_math_mode` sets both explicitly for
every precision; with fp16/bf16 autocast the few fp32 matmuls and convolutions left
run in TF32. ``cudnn.benchmark`` is on for CUDA jobs (their shapes are fixed). The
switches are process-wide: :func:`apply_math_mode` returns what puts the previous ones
back, and the Trainer calls it when its run ends. Both read and write them through the
``fp32_precision`` API only: once it has been used, reading the legacy
``torch.backends.cuda.matmul.allow_tf32`` raises (2.11, 2.13) until the settings are restored.

A ``deterministic`` job also turns on ``torch.use_deterministic_algorithms`` (every device)
and, on CUDA, ``cudnn.deterministic`` with ``cudnn.benchmark`` off: autotuning times the
candidate algorithms and keeps the fastest, so two runs can pick different ones, each with
its own rounding. ``warn_only`` stays False: with True, torch keeps the nondeterministic
kernels it has no alternative for and only warns (flash and memory-efficient attention
backward even keep their atomics-based kernels although a deterministic one exists), which
would break the promise silently; with False such an op raises, and
:func:`amptrain.contract.errors.classify_failure` turns that into an ``invalid_spec`` naming
the option and the op. cuBLAS also needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the
environment before the process's first cuBLAS call (torch reads it once, then caches its
verdict): the engine reads and writes no environment, so the worker's training process sets
it (:func:`amptrain.worker.child.main.train`); without it the first matmul raises, and is
classified the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from amptrain.contract.errors import InvalidSpecError
from amptrain.engine.cpu_probe import (
    BF16_MIN_SPEEDUP,
    Bf16Probe,
    cpu_features,
    cpu_has_amx,
    measure_bf16,
)

Effective = Literal["fp32", "tf32", "fp16", "bf16"]

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""What a deterministic job's training process needs in the ``CUBLAS_WORKSPACE_CONFIG``
environment variable before its first cuBLAS call: torch reads the variable then, once, and
under deterministic mode refuses cuBLAS unless it is ``:4096:8`` or ``:16:8`` (cuBLAS's
documented reproducible workspaces; the larger one, 8 buffers of 4 MiB, leaves cuBLAS more
room). The worker's training process sets it (the engine reads and writes no environment)."""
DETERMINISTIC_CUBLAS_CONFIGS = (":4096:8", ":16:8")

__all__ = [
    "AUTOCAST_DTYPES",
    "CUBLAS_WORKSPACE_CONFIG",
    "DETERMINISTIC_CUBLAS_CONFIGS",
    "PrecisionChoice",
    "apply_math_mode",
    "choose_precision",
    "cpu_has_amx",
]


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision asked for, the one used, the reason, and the device it was decided for."""

    requested: str
    effective: Effective
    reason: str
    device: str
    measurement: dict[str, Any] | None = None
    """``auto`` decided by measuring the job's model: the step times, ratio, steps and
    seconds it took (:mod:`amptrain.engine.auto_precision`); None: decided by rule."""

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None when autocast stays off (fp32, tf32)."""
        return AUTOCAST_DTYPES[self.effective]

    @property
    def uses_scaler(self) -> bool:
        """Only fp16 needs loss scaling; bf16 has fp32's exponent range."""
        return self.effective == "fp16"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["measurement"] is None:  # a rule's choice: the event keeps its old shape
            del data["measurement"]
        return data


def resolve_device(kind: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without CUDA is a spec error."""
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise InvalidSpecError("device: 'cuda' requested but this worker has no CUDA device")
    return torch.device(kind)


def choose_precision(
    requested: str, device: torch.device, cpu_probe: Bf16Probe | None = None
) -> PrecisionChoice:
    """Apply the precision policy; raises InvalidSpecError for bf16 on a GPU without it.

    ``cpu_probe`` is the worker's own measurement of bf16 on this CPU: every job on a
    worker then decides ``auto`` the same way (a fresh measurement per process can land
    on either side of the threshold on a busy machine). None: measure here, once."""
    if requested not in ("auto", *AUTOCAST_DTYPES):
        raise InvalidSpecError(
            f"precision: unknown value {requested!r}; allowed: auto, {', '.join(AUTOCAST_DTYPES)}"
        )
    if device.type == "cuda":
        return _choose_cuda(requested, device)
    return _choose_cpu(requested, cpu_probe)


_EXPLICIT = {
    "fp32": "requested explicitly: strict IEEE fp32 (TF32 off for matmuls and convolutions)",
    "tf32": "requested explicitly: fp32 with TF32 tensor-core matmuls and convolutions",
    "fp16": "requested explicitly",
    "bf16": "requested explicitly",
}


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
    if requested == "tf32" and major < 8:
        return PrecisionChoice(
            requested,
            "fp32",
            f"tf32 needs capability >= 8.0; this GPU has {cap}, so fp32 runs in IEEE",
            name,
        )
    return PrecisionChoice(requested, requested, _EXPLICIT[requested], name)  # type: ignore[arg-type]


def _choose_cpu(requested: str, cpu_probe: Bf16Probe | None) -> PrecisionChoice:
    feats = cpu_features()
    if requested == "auto":
        effective, reason = _cpu_auto(feats.amx, feats.avx512_bf16, cpu_probe)
        return PrecisionChoice(requested, effective, reason, "cpu")
    if requested == "tf32":
        return PrecisionChoice(
            requested,
            "fp32",
            "tf32 is a CUDA (capability >= 8.0) mode; the CPU runs IEEE fp32",
            "cpu",
        )
    reason = "requested explicitly"
    if requested == "bf16" and feats.avx512_bf16 and not feats.amx:
        reason += "; this CPU has avx512_bf16 but no AMX: bf16 may be slower than fp32 ('auto' measures it)"
    elif requested in ("bf16", "fp16") and not feats.amx:
        # Correct but emulated: allowed (tests and debugging rely on it), just slow.
        reason += "; this CPU has no AMX, so low precision runs emulated (often slower than fp32)"
    return PrecisionChoice(requested, requested, reason, "cpu")  # type: ignore[arg-type]


def _cpu_auto(amx: bool, avx512_bf16: bool, probe: Bf16Probe | None) -> tuple[Effective, str]:
    if amx:
        return "bf16", "CPU has AMX-BF16 tiles"
    if not avx512_bf16:
        return (
            "fp32",
            "CPU without AMX or avx512_bf16: bf16 autocast would be emulated, slower than fp32",
        )
    probe = probe or measure_bf16()
    if probe.speedup >= BF16_MIN_SPEEDUP:
        return "bf16", f"CPU has avx512_bf16 (no AMX) and {probe.describe()} >= {BF16_MIN_SPEEDUP}x"
    return "fp32", f"CPU has avx512_bf16 (no AMX) but {probe.describe()} < {BF16_MIN_SPEEDUP}x"


def apply_math_mode(
    choice: PrecisionChoice, device: torch.device, deterministic: bool = False
) -> Callable[[], None]:
    """Set TF32, cuDNN autotuning and (``deterministic``) torch's deterministic mode for the
    job deliberately (process-wide switches); returns what restores them as they were."""
    restore_deterministic = _deterministic_mode(device) if deterministic else _nothing
    if device.type != "cuda":
        return restore_deterministic
    restore_cuda = _restorer()
    # The input shapes of a job never change, so autotuning pays, unless the job asked for
    # bitwise repeatability (see the module docstring).
    torch.backends.cudnn.benchmark = not deterministic
    _set_fp32_precision("ieee" if choice.effective == "fp32" else "tf32")

    def restore() -> None:
        restore_cuda()
        restore_deterministic()

    return restore


def _nothing() -> None:
    pass


def _deterministic_mode(device: torch.device) -> Callable[[], None]:
    """Turn on torch's deterministic algorithms (and cuDNN's on CUDA); what puts them back."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic
    torch.use_deterministic_algorithms(True, warn_only=False)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True

    def restore() -> None:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn

    return restore


def _fp32_switches() -> list[Any]:
    """The objects whose ``fp32_precision`` a job sets (torch >= 2.9), or [] before that API."""
    if not hasattr(torch.backends.cudnn, "conv"):
        return []
    return [torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn]


def _set_fp32_precision(mode: str) -> None:
    switches = _fp32_switches()
    for switch in switches:
        switch.fp32_precision = mode
    if not switches:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"


def _restorer() -> Callable[[], None]:
    """What puts the current switches back ("none" included: the inherit-the-default value)."""
    benchmark = torch.backends.cudnn.benchmark
    switches = _fp32_switches()
    if switches:
        saved = [s.fp32_precision for s in switches]

        def restore() -> None:
            torch.backends.cudnn.benchmark = benchmark
            for switch, value in zip(switches, saved, strict=True):
                switch.fp32_precision = value

        return restore
    legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def restore_legacy() -> None:
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy

    return restore_legacy


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
