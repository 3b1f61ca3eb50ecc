"""Resume after kill -9, mid-epoch, for every dataset read from disk: `amptrain train`
(the CLI's local runner, loader processes on) is killed with SIGKILL once it has
checkpointed, started again on the same checkpoint directory, and from the step it resumed
at its losses and final weights equal, bit for bit, those of a run that was never
interrupted (built by threads, not processes). Real data: scikit-learn's digits as PNG
files (image-folder) and in tar shards (webdataset), the standard library's source as a
token file and as a Parquet table."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch
from PIL import Image

from tests.components.stdlib_corpus import stdlib_sources
from tests.support.digits import DIGITS_FOLDER, write_digit_folders

pytestmark = pytest.mark.slow

EVERY = 3  # checkpoint interval; the straight run goes to LAST, the resumed run 2 past a kill
LAST = 30
IMAGES = {"model": {"name": "mlp", "args": {"width": 32}}}
TEXT = {"model": {"name": "transformer", "args": {"d_model": 32, "n_layers": 1, "n_heads": 2}}}


def _digit_shards(root: Path) -> None:
    """The digits as WebDataset shards: 4 tar files of PNG + cls members."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    (root / "shards").mkdir(parents=True)
    for shard in range(4):
        with tarfile.open(root / "shards" / f"digits-{shard}.tar", "w") as tar:
            for index in range(shard, len(pixels), 4):
                png = io.BytesIO()
                Image.fromarray(pixels[index]).save(png, format="PNG")
                label = str(int(digits.target[index])).encode()
                for ext, data in (("png", png.getvalue()), ("cls", label)):
                    info = tarfile.TarInfo(f"{index:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _text(root: Path) -> None:
    """The standard library's source, split by file: as bytes in a uint16 token file, and
    one row per file in a Parquet table."""
    train, _ = stdlib_sources(train_bytes=60_000, held_bytes=0)
    tokens = np.frombuffer("".join(train).encode(), dtype=np.uint8).astype("<u2")
    tokens.tofile(root / "corpus.bin")
    pq.write_table(pa.table({"text": train}), root / "corpus.parquet", row_group_size=8)


DATASETS: dict[str, dict[str, Any]] = {
    "image-folder": {
        **IMAGES,
        "dataset": {
            "name": "image-folder",
            "args": {"path": DIGITS_FOLDER, "image_size": 8, "channels": 1, "min_crop_scale": 0.5},
        },
    },
    "webdataset": {
        **IMAGES,
        "dataset": {
            "name": "webdataset",
            "args": {
                "pattern": "shards/digits-{0..3}.tar",
                "image_size": 8,
                "channels": 1,
                "shuffle_window": 64,
            },
        },
    },
    "token-file": {
        **TEXT,
        "dataset": {
            "name": "token-file",
            "args": {"path": "corpus.bin", "seq_len": 32, "vocab_size": 256},
        },
    },
    "parquet": {
        **TEXT,
        "dataset": {
            "name": "parquet",
            "args": {
                "path": "corpus.parquet",
                "task": "language_model",
                "input_column": "text",
                "seq_len": 32,
            },
        },
    },
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_digit_folders(root)
    _digit_shards(root)
    _text(root)
    return root


def _spec(name: str, max_steps: int, loader_workers: int) -> dict[str, Any]:
    return {
        **DATASETS[name],
        "device": "cpu",
        "precision": "bf16",
        "batch_size": 8,
        "max_steps": max_steps,
        "seed": 3,
        "loader_workers": loader_workers,
        "schedule": {"name": "constant"},  # the learning rate does not depend on max_steps
        "checkpoint": {"every_steps": EVERY, "keep_last": 20},
        "telemetry": {"flush_every_steps": 1},
    }


def _command(tmp: Path, spec: dict[str, Any], out: Path, ckpt: Path, root: Path) -> list[str]:
    path = tmp / f"spec-{len(list(tmp.glob('spec-*')))}.json"
    path.write_text(json.dumps(spec))
    return [sys.executable, "-m", "amptrain.cli.main", "train", str(path), "--out", str(out),
            "--checkpoint-dir", str(ckpt), "--data-root", str(root)]  # fmt: skip


def _checkpoints(ckpt: Path) -> list[int]:
    """Steps of the complete checkpoints (a ``.pt`` file appears by an atomic rename)."""
    names = [p.name for p in ckpt.glob("step-*.pt")] if ckpt.exists() else []
    return [int(re.findall(r"\d+", name)[0]) for name in names]


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "metric"}


def _weights(ckpt: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load((ckpt / f"step-{step:09d}.safetensors").read_bytes())


@pytest.mark.parametrize("name", list(DATASETS))
def test_a_killed_run_resumes_bit_for_bit(name: str, data_root: Path, tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    done = subprocess.run(
        _command(tmp_path, _spec(name, LAST, 0), tmp_path / "straight.jsonl", straight, data_root),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    out = tmp_path / "killed.jsonl"
    proc = subprocess.Popen(
        _command(tmp_path, _spec(name, 1_000_000, 2), out, killed, data_root),
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _checkpoints(killed):
            assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the training process and its loader processes
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    # The resumed run goes two checkpoints past the newest one the killed run wrote.
    newest = max(_checkpoints(killed))
    end = newest + 2 * EVERY
    assert end <= LAST, f"the killed run reached step {newest} before the kill landed"
    rerun = subprocess.run(
        _command(tmp_path, _spec(name, end, 2), tmp_path / "resumed.jsonl", killed, data_root),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from step {newest}" in rerun.stderr
    resumed = _losses(tmp_path / "resumed.jsonl")
    assert sorted(resumed) == list(range(newest + 1, end + 1))
    reference = _losses(tmp_path / "straight.jsonl")
    assert resumed == {step: reference[step] for step in resumed}
    final, expected = _weights(killed, end), _weights(straight, end)
    assert final.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(final[key], tensor), key
