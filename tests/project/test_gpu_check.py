"""deploy/gpu-check.sh works the first time on a bare GPU box: simulated here on every run.

The lent box, as it is: its ``python3`` is itself a virtual environment's interpreter holding
torch and the libraries its image builds for it (here this machine's Python with the README's
torch and torchvision pins, timm and transformers), no network,
no package index; everything else comes from a wheelhouse built beforehand for that Python.
The check's dry run then goes through every stage on the CPU, with the network cut
(``unshare -n``, loopback only) and pip's configuration and index switched off.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "deploy" / "gpu-check.sh"
SMOKE = ROOT / "deploy" / "gpu-smoke.sh"
# The box's image: torch and the libraries built for it (the README's pins), which the
# wheelhouse leaves out.
BOX_PACKAGES = ("torch", "torchvision", "timm", "transformers")
TORCH = metadata.version("torch").split("+")[0]
# The stages, in the order the check must run them (most valuable first).
STAGES = (
    "environment",
    "cuda",
    "amp-speedup",
    "telemetry",
    "data-path",
    "sync-check",
    "pytest-gpu",
    "smoke",
    "determinism",
)
OK = {"PASS", "MISSED"}  # MISSED: a benchmark goal not met, expected on a CPU


def summary(output: str) -> dict[str, tuple[str, str]]:
    """The summary table: stage -> (status, detail), in the order printed."""
    _, found, table = output.rpartition("== amptrain GPU check summary")
    assert found, output[-3000:]
    rows: dict[str, tuple[str, str]] = {}
    for line in table.splitlines()[2:]:
        match = re.match(r"(\S+)\s+(NOT REACHED|\S+)\s+(\d+)\s\s(.*)$", line)
        if match:
            rows[match[1]] = (match[2], match[4])
    return rows


def box_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a bare box: no pip configuration, index, find-links or project
    variables from this machine; the box interpreter first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "AMPTRAIN_", "PYTHON", "VIRTUAL_ENV", "PYTEST_"))
    }
    bin_dir = Path(sys.executable).parent
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != bin_dir]
    return {
        **env,
        "PATH": os.pathsep.join(path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "WORK": str(tmp_path / "work"),
        **extra,
    }


def test_a_stage_without_time_left_reports_not_reached_and_the_check_fails(
    tmp_path: Path,
) -> None:
    # No wheelhouse (a dry run then uses $PYTHON as it is) and a budget the torch probe
    # alone uses up: every measuring stage is reported, none starts, none hangs.
    result = subprocess.run(
        ["bash", str(CHECK), "--dry-run"],
        cwd=ROOT,
        env=box_env(
            tmp_path,
            PYTHON=sys.executable,
            AMPTRAIN_WHEELHOUSE=str(tmp_path / "none"),
            AMPTRAIN_GPU_CHECK_BUDGET="15",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = summary(result.stdout)
    assert tuple(rows) == STAGES
    assert rows["environment"][0] == "SKIP" and "no wheelhouse" in rows["environment"][1]
    assert {rows[s][0] for s in STAGES[2:]} == {"NOT REACHED"}, rows
    assert result.returncode == 1


@pytest.mark.slow
def test_the_smoke_shows_the_capability_report_and_stops_at_once_when_up_dies(
    tmp_path: Path,
) -> None:
    # A setting `amptrain up` refuses: it exits within a second, long before the API's
    # 180 s start-up timeout.
    env = {
        **box_env(tmp_path, PYTHON=sys.executable),
        "AMPTRAIN_SMOKE_DEVICE": "cpu",
        "AMPTRAIN_LEASE_SECONDS": "-1",
        "TMPDIR": str(tmp_path),
    }
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(SMOKE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=170
    )
    took = time.monotonic() - started
    out = result.stdout + result.stderr
    assert result.returncode != 0
    report = out.split("== capability report (python -m amptrain.worker.main.devices)\n", 1)[1]
    assert report.startswith("torch ") and '"devices": [' in report  # summary line, then JSON
    assert "amptrain up exited while waiting for the API" in out
    assert "amptrain up exited with status 1" in out
    assert "lease_seconds" in out  # the tail of its log says why
    assert took < 120, f"waited {took:.0f}s for an API whose process had died"


def _network_cut() -> list[str]:
    """The command prefix that runs a command with no network but loopback, or skip."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) to cut the network")
    probe = subprocess.run(
        [unshare, "-n", ip, "link", "set", "lo", "up"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {probe.stderr.strip()[-200:]}")
    return [unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]


def _link_image_packages(box: Path, image: Path) -> None:
    """Give the box venv the image's packages: links to this environment's installed
    distributions of :data:`BOX_PACKAGES` and everything they require, in a directory its
    site-packages names in a ``.pth`` file (pip there sees them installed)."""
    seen: set[str] = set()
    todo = list(BOX_PACKAGES)
    image.mkdir()
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this environment does not have
        for req in dist.requires or ():
            if "extra ==" not in req:
                todo.append(re.match(r"[A-Za-z0-9._-]+", req)[0])  # type: ignore[index]
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            source = Path(str(dist.locate_file(top)))
            if not top.startswith("..") and source.exists() and not (image / top).exists():
                (image / top).symlink_to(source)
    (site,) = box.glob("lib/python*/site-packages")
    (site / "image-packages.pth").write_text(f"{image}\n")


def _start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.args, out[-3000:])
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)  # the check's own budget is 480 s; about 140 s alone, 300 s loaded
def test_the_dry_run_passes_every_stage_on_a_simulated_gpu_box(tmp_path: Path) -> None:
    cut = _network_cut()
    started = time.monotonic()
    # The box: a venv's interpreter (base: this machine's Python) that sees its image's
    # torch, torchvision, timm and transformers (these of this test's environment, linked in:
    # installing a 5.5 GB CUDA build again would take minutes); and, meanwhile, the
    # wheelhouse built where pip reaches an index, for the box's Python.
    base = getattr(sys, "_base_executable", sys.executable)
    box, wheels = tmp_path / "box", tmp_path / "wheelhouse"
    box_python = box / "bin" / "python"
    install = f'"{base}" -m venv "{box}"'
    making_box = _start(["sh", "-c", install])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    building = _start(
        ["bash", str(CHECK), "--build-wheelhouse", str(wheels)],
        env={**os.environ, "PYTHON": sys.executable, "WHEEL_PYTHON": version},
    )
    try:
        assert "wheelhouse ready" in _finish(building, 300)
        _finish(making_box, 300)
        _link_image_packages(box, tmp_path / "image")
    finally:
        for proc in (building, making_box):
            proc.kill()  # a no-op for one that ended
            proc.wait()
    requirements = (wheels / "requirements.txt").read_text().split()
    assert not any(
        re.match(r"(torch|torchvision|timm|transformers|amptrain|pytest-xdist)\b", r)
        for r in requirements
    )
    prepared = time.monotonic() - started

    env = box_env(
        tmp_path,
        PYTHON=str(box_python),
        AMPTRAIN_WHEELHOUSE=str(wheels),
        PATH=f"{box / 'bin'}{os.pathsep}{box_env(tmp_path)['PATH']}",
        TMPDIR=str(tmp_path),  # the smoke's data directory
    )
    result = subprocess.run(
        [*cut, "bash", str(CHECK), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - started
    rows = summary(result.stdout)
    print(result.stdout[result.stdout.rfind("== amptrain GPU check summary") :])
    print(f"box and wheelhouse built in {prepared:.0f}s; everything in {took:.0f}s")

    assert tuple(rows) == STAGES, rows
    # The venv saw the box's torch (through the box venv, not its base interpreter).
    assert rows["environment"][0] == "PASS" and f"torch {TORCH}" in rows["environment"][1], rows
    assert rows["cuda"][0] == "SKIP" and "no CUDA device" in rows["cuda"][1]
    for stage in STAGES[2:]:
        assert rows[stage][0] in OK, (stage, rows[stage], result.stdout[-4000:])
    for stage in ("sync-check", "pytest-gpu"):  # collected cleanly, every GPU test skipped
        detail = rows[stage][1]
        assert "skipped" in detail and not re.search(r"failed|error", detail), rows[stage]
    assert "loop waits on data" in rows["data-path"][1], rows["data-path"]
    assert "engine/bare" in rows["amp-speedup"][1], rows["amp-speedup"]
    for workload in ("cnn", "transformer"):  # off and on, each in its own process
        assert f"{workload}: off " in rows["determinism"][1], rows["determinism"]
    assert rows["smoke"][0] == "PASS", rows["smoke"]
    assert result.returncode == 0, result.stdout[-4000:]
    # Passed: the two interpreters' ~1 GB need not wait for pytest to prune old runs.
    shutil.rmtree(box)
    shutil.rmtree(tmp_path / "work" / "venv")
