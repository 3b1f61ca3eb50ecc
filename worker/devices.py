"""The worker's capability report: its devices and the CUDA/cuDNN/NCCL/PyTorch versions.

``python -m worker.devices`` prints the report as JSON. The worker's main
process must never initialise CUDA (its pool processes are forked from it, and
CUDA does not survive a fork), so :func:`gather` runs that command in a
short-lived subprocess and reads its output; only the subprocess imports torch.

Each device says what ``precision: auto`` picks on it and why, using the
engine's own policy (:func:`trainer_core.engine.precision.choose_precision`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from typing import Any

REPORT_TIMEOUT_S = 120.0


def gather(timeout: float = REPORT_TIMEOUT_S, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m worker.devices`` and return its report (or one naming the failure)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "worker.devices"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return _failed(f"capability report timed out after {timeout:.0f}s")
    if proc.returncode != 0:
        return _failed(f"capability report exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    try:
        return dict(json.loads(proc.stdout))
    except json.JSONDecodeError as exc:
        return _failed(f"capability report is not JSON ({exc})")


def _failed(error: str) -> dict[str, Any]:
    return {"devices": [], "versions": {}, "error": error}


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
    from trainer_core.engine.precision import choose_precision

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

    from trainer_core.engine.precision import choose_precision, cpu_has_amx

    choice = choose_precision("auto", torch.device("cpu"))
    memory = psutil.virtual_memory().total
    return {
        "type": "cpu",
        "name": _cpu_model() or platform.processor() or platform.machine(),
        "cores": os.cpu_count() or 1,
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_bytes": int(memory),
        "amx": cpu_has_amx(),
        "isa": torch.backends.cpu.get_cpu_capability(),
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


def summary(report: dict[str, Any]) -> str:
    """One line per device for the worker's start-up log."""
    v = report.get("versions") or {}
    lines = [
        f"torch {v.get('torch')} cuda {v.get('cuda')} cudnn {v.get('cudnn')} nccl {v.get('nccl')}"
    ]
    for d in report.get("devices") or []:
        if d["type"] == "cuda":
            lines.append(
                f"cuda:{d['index']} {d['name']} cc {d['compute_capability']} "
                f"{d['memory_bytes'] / 2**30:.1f} GiB tensor_cores={d['tensor_cores']} "
                f"bf16={d['bf16']} auto={d['auto_precision']['effective']}"
            )
        else:
            lines.append(
                f"cpu {d['name']} ({d['cores']} cores) amx={d['amx']} "
                f"auto={d['auto_precision']['effective']}"
            )
    if report.get("error"):
        lines.append(f"error: {report['error']}")
    return "; ".join(lines)


def main() -> int:
    json.dump(collect(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
