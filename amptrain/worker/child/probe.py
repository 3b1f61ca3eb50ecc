"""The device probe: this machine's devices and CUDA/cuDNN/NCCL/PyTorch versions.

Runs as ``python -m amptrain.worker.child.probe`` (started by :mod:`amptrain.worker.main.devices`)
and prints the report as JSON. It imports torch and may initialise CUDA, which
is why it is a process of its own.

Each device says what ``precision: auto``'s capability rule picks on it and why, using the
engine's own policy (:func:`amptrain.engine.precision.choose_precision`): the fallback of
a job whose model cannot be measured (jobs measure their own model first,
:mod:`amptrain.engine.auto_precision`). The
CPU entry carries the flags that policy reads (``amx``, ``avx512_bf16``) and the
short bf16-vs-fp32 measurement it relies on when only ``avx512_bf16`` is present
(``bf16_probe``, see :mod:`amptrain.engine.cpu_probe`). A training child on
such a CPU measures again, once, with the same function: the report shows what
jobs on this machine will decide, without a new field in the launch message.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from typing import Any


def collect() -> dict[str, Any]:
    """The report of this process's view of the machine (imports torch; may initialise CUDA)."""
    import torch

    cuda = torch.cuda.is_available()
    devices = _cuda_devices(torch) if cuda else []
    devices.append(_cpu_device(torch))
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cuda_available": cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "versions": _versions(torch, cuda),
        "devices": devices,
    }


def _versions(torch: Any, cuda: bool) -> dict[str, Any]:
    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    try:
        if torch.backends.cudnn.is_available():
            versions["cudnn"] = _cudnn_version(torch.backends.cudnn.version())
    except Exception:  # a broken cuDNN install is a report, not a crash
        pass
    if cuda:
        try:
            nccl = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
    return versions


def _cudnn_version(raw: int | None) -> str | None:
    """cuDNN encodes 9.1.0 as 90100 (8.x as 8xyz): spell it as people do."""
    if not raw:
        return None
    major, rest = divmod(raw, 10000) if raw >= 10000 else divmod(raw, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def _cuda_devices(torch: Any) -> list[dict[str, Any]]:
    from amptrain.engine.precision import choose_precision

    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        major, minor = props.major, props.minor
        choice = choose_precision("auto", torch.device("cuda", index))
        out.append(
            {
                "type": "cuda",
                "index": index,
                "name": props.name,
                "compute_capability": f"{major}.{minor}",
                "memory_bytes": int(props.total_memory),
                "multiprocessors": int(props.multi_processor_count),
                "tensor_cores": major >= 7,
                "bf16": major >= 8,
                "auto_precision": {"effective": choice.effective, "reason": choice.reason},
            }
        )
    return out


def _cpu_device(torch: Any) -> dict[str, Any]:
    import psutil

    from amptrain.engine.cpu_probe import cpu_features, measure_bf16
    from amptrain.engine.precision import choose_precision

    feats = cpu_features()
    # Measured whatever the flags say, so the report shows what bf16 is worth here; the
    # policy consults the same (cached) measurement only when the flags leave it open.
    probe = measure_bf16()
    choice = choose_precision("auto", torch.device("cpu"))
    memory = psutil.virtual_memory().total
    return {
        "type": "cpu",
        "name": _cpu_model() or platform.processor() or platform.machine(),
        "cores": os.cpu_count() or 1,
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": int(memory),
        "amx": feats.amx,
        "avx512_bf16": feats.avx512_bf16,
        "isa": feats.isa,
        "bf16_probe": probe.to_dict(),
        "auto_precision": {"effective": choice.effective, "reason": choice.reason},
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def main() -> int:
    json.dump(collect(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
