"""The worker's devices, as the Celery main process sees them.

The main process must never initialise CUDA (its pool processes are forked from
it, and CUDA does not survive a fork), so :func:`gather` runs ``python -m amptrain.worker.child.probe`` in a short-lived
subprocess and reads its report; only that subprocess imports torch.
``python -m amptrain.worker.main.devices`` prints that report (deploy/gpu-smoke.sh shows it).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

REPORT_TIMEOUT_S = 120.0


def gather(timeout: float = REPORT_TIMEOUT_S, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m amptrain.worker.child.probe`` and return its report (or one naming the failure)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "amptrain.worker.child.probe"],
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


_report: dict[str, Any] | None = None


def report() -> dict[str, Any]:
    """This machine's capability report, taken once per process. ``amptrain worker`` takes
    it before Celery forks, so every pool process inherits it (see :func:`known_report`)."""
    global _report
    if _report is None:
        _report = gather()
    return _report


def known_report() -> dict[str, Any] | None:
    """The report if this process (or the one it was forked from) already took it."""
    return _report


def cpu_bf16_probe(rep: dict[str, Any] | None) -> dict[str, Any] | None:
    """The CPU's measured bf16-vs-fp32 probe in a report, if it has one."""
    for device in (rep or {}).get("devices") or []:
        if device.get("type") == "cpu" and device.get("bf16_probe"):
            return dict(device["bf16_probe"])
    return None


@functools.cache
def visible_gpus() -> tuple[str, ...]:
    """GPU ids this worker may use: ``CUDA_VISIBLE_DEVICES`` if set, else the report's GPUs.

    Asked once per process; ``amptrain worker`` asks before Celery forks its pool
    processes, which inherit the answer.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        cuda = [d for d in report().get("devices") or [] if d.get("type") == "cuda"]
        env = ",".join(str(d["index"]) for d in cuda)
    return tuple(d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1")


_per_job = 1


def set_devices_per_job(k: int) -> None:
    """``amptrain worker --devices-per-job K``, set before Celery forks its pool processes
    (which inherit it)."""
    global _per_job
    _per_job = k


def devices_per_job() -> int:
    """How many devices each job of this worker trains on (1 unless ``--devices-per-job``)."""
    return _per_job


def slot_gpus(index: int, gpus: tuple[str, ...], per_job: int) -> tuple[str, ...]:
    """The GPUs pool process ``index`` owns: the ``index``-th block of ``per_job`` visible
    GPUs, ``[index*K, (index+1)*K)`` (wrapping around when there are more pool processes
    than blocks, as one GPU per process always did); none on a worker without GPUs."""
    blocks = len(gpus) // per_job
    if blocks == 0:
        return ()
    start = (index % blocks) * per_job
    return gpus[start : start + per_job]


def _failed(error: str) -> dict[str, Any]:
    return {"devices": [], "versions": {}, "error": error}


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
                f"avx512_bf16={d.get('avx512_bf16')} bf16_probe={_probe_text(d.get('bf16_probe'))} "
                f"auto={d['auto_precision']['effective']}"
            )
    if report.get("error"):
        lines.append(f"error: {report['error']}")
    return "; ".join(lines)


def _probe_text(probe: dict[str, Any] | None) -> str:
    """The measured bf16-vs-fp32 training step, e.g. ``0.62x (fp32 1.20 ms, bf16 1.94 ms)``."""
    if not probe:
        return "none"
    return (
        f"{probe['speedup']:.2f}x (fp32 {probe['fp32_ms']:.2f} ms, bf16 {probe['bf16_ms']:.2f} ms)"
    )


def main() -> int:
    """``python -m amptrain.worker.main.devices``: this machine's capability report, as a worker takes it
    (in a subprocess), one summary line then the JSON; exit 1 when the report failed."""
    rep = gather()
    print(summary(rep))
    print(json.dumps(rep, indent=2))
    return 1 if rep.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
