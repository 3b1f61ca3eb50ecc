"""``amptrain train``: the local runner, run as a real subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.components.test_plugins import example_plugin_site

pytestmark = pytest.mark.slow

TINY: dict[str, Any] = {
    "model": {"name": "mlp", "args": {"width": 16}},
    "dataset": {"name": "synthetic-classification", "args": {"features": 8, "num_samples": 256}},
    "max_steps": 12,
    "batch_size": 8,
    "device": "cpu",
    "precision": "fp16",
    "telemetry": {"flush_every_steps": 4},
}


def amptrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amptrain.cli.main", "train", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _write(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec) if path.suffix == ".yaml" else json.dumps(spec))
    return path


def _records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_trains_and_writes_every_record_as_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    done = amptrain(str(_write(tmp_path / "spec.yaml", TINY)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    records = _records(out.read_text())
    metrics = [r for r in records if r["kind"] == "metric"]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert all(m["loss_scale"] == 65536.0 for m in metrics)
    precision = next(r for r in records if r["kind"] == "event" and r["type"] == "precision")
    assert precision["data"]["effective"] == "fp16"
    assert "12/12" in done.stderr and "done: 12 steps, fp16" in done.stderr
    assert done.stdout == ""
    # The synthetic pool has a held-out split, so the run evaluates once at the end.
    (evaluated,) = [r for r in records if r["kind"] == "eval"]
    assert evaluated["step"] == 12
    assert list(evaluated["values"]) == ["eval_loss", "accuracy", "top5_accuracy"]  # 10 classes
    shown = f"eval step 12: eval_loss {evaluated['values']['eval_loss']:.4f}, accuracy"
    assert shown in done.stderr


def test_records_go_to_stdout_by_default(tmp_path: Path) -> None:
    done = amptrain(str(_write(tmp_path / "spec.json", {**TINY, "max_steps": 3})))
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in _records(done.stdout) if r["kind"] == "metric"] == [1, 2, 3]


def test_a_bad_spec_names_every_bad_field(tmp_path: Path) -> None:
    bad = {**TINY, "max_step": 3, "model": {"name": "mlp", "args": {"widht": 3}}}
    done = amptrain(str(_write(tmp_path / "bad.json", bad)))
    assert done.returncode == 2
    assert "error [invalid_spec]" in done.stderr
    assert "max_step: Extra inputs are not permitted" in done.stderr
    assert "model.args.widht: unexpected argument; allowed: depth, dropout, width" in done.stderr
    unknown = amptrain(
        str(_write(tmp_path / "unknown.json", {**TINY, "dataset": {"name": "nope"}}))
    )
    assert unknown.returncode == 2 and "dataset.name: unknown dataset 'nope'" in unknown.stderr
    (tmp_path / "broken.json").write_text("{")
    assert amptrain(str(tmp_path / "broken.json")).returncode == 2


def test_failures_exit_non_zero_with_the_error_and_data_roots_come_from_the_flag(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(32, 4)), y=rng.integers(0, 3, 32))
    spec = {
        **TINY,
        "max_steps": 2,
        "dataset": {"name": "tensors", "args": {"path": str(tmp_path / "d.npz")}},
    }
    path = _write(tmp_path / "spec.json", spec)
    refused = amptrain(str(path))
    assert refused.returncode == 1
    assert (
        "error [invalid_spec]" in refused.stderr
        and "no data roots are configured" in refused.stderr
    )
    allowed = amptrain(str(path), "--data-root", str(tmp_path))
    assert allowed.returncode == 0, allowed.stderr


def test_plugins_are_found_through_entry_points(tmp_path: Path) -> None:
    spec = {
        **TINY,
        "max_steps": 2,
        "model": {"name": "logreg"},
        "dataset": {"name": "example-blobs"},
        "eval": {"metrics": ["accuracy", "brier_score"]},
    }
    path = _write(tmp_path / "spec.json", spec)
    assert amptrain(str(path)).returncode == 2
    pythonpath = os.pathsep.join(str(p) for p in example_plugin_site(tmp_path / "site"))
    done = amptrain(str(path), env={"PYTHONPATH": pythonpath})
    assert done.returncode == 0, done.stderr
    # The plugin's metric is evaluated at the end beside the built-in one, and printed.
    assert re.search(r"eval step 2: accuracy [0-9.]+, brier_score [0-9.]+", done.stderr)


def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_a_rerun_resumes(tmp_path: Path) -> None:
    spec = {**TINY, "max_steps": 1_000_000, "checkpoint": {"every_steps": 1_000_000}}
    path = _write(tmp_path / "spec.json", spec)
    out, ckpt = tmp_path / "records.jsonl", tmp_path / "ckpt"
    args = [
        sys.executable,
        "-m",
        "amptrain.cli.main",
        "train",
        str(path),
        "--out",
        str(out),
        "--checkpoint-dir",
        str(ckpt),
    ]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_text().count('"kind":"metric"') >= 8):
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "error [cancelled]" in stderr
    stopped_at = max(r["step"] for r in _records(out.read_text()) if r["kind"] == "metric")
    assert any(ckpt.iterdir())
    rerun = amptrain(
        str(_write(path, {**spec, "max_steps": stopped_at + 3})), "--checkpoint-dir", str(ckpt)
    )
    assert rerun.returncode == 0, rerun.stderr
    steps = [r["step"] for r in _records(rerun.stdout) if r["kind"] == "metric"]
    assert steps == [stopped_at + 1, stopped_at + 2, stopped_at + 3]
    assert f"resumed from step {stopped_at}" in rerun.stderr


def test_layer_norms_are_written_and_printed_every_k_steps(tmp_path: Path) -> None:
    spec = {**TINY, "telemetry": {"flush_every_steps": 4, "layer_grad_norms_every": 6}}
    out = tmp_path / "records.jsonl"
    done = amptrain(str(_write(tmp_path / "spec.json", spec)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    layers = [r for r in _records(out.read_text()) if r["kind"] == "layer_grad_norm"]
    assert [r["step"] for r in layers] == [6, 12]
    assert list(layers[0]["values"]) == ["net.1", "net.2", "net.5", "net.6", "net.9"]
    assert re.search(r"layer grad norms step 12 · 5 layers · max net\.\S+ [0-9.e+-]+", done.stderr)
    # Every metric record still drives the progress (none taken for a metric).
    assert "12/12" in done.stderr
