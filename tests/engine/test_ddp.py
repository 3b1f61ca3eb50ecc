"""Data-parallel training: 2 ranks on gloo (CPU), started by torchrun as the service will.

Three launches in all (each costs two ``import torch``): the CLI run a stop interrupts,
its resumption, and the in-process scenarios of ``ddp_ranks.py``. Every comparison is
against the same job on one device accumulating the same micro-batches, or (evaluation)
rank 0's model evaluated on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.errors import ResumeMismatchError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.engine import ddp_ranks
from tests.support.digits import write_digits
from tests.support.probe import ROOT, probe_paths

pytestmark = pytest.mark.slow


def torchrun(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 ARGS`` with the probe plugin discoverable."""
    path = os.pathsep.join(map(str, [*probe_paths(tmp_path), ROOT]))
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    return subprocess.run(
        [sys.executable, *launcher, "--nproc-per-node", "2", "--max-restarts", "0", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=240,
    )


def probe_spec(devices: int, **model_args: Any) -> dict[str, Any]:
    """bf16 job on the probe model; 1 device accumulates what 2 devices split."""
    return {
        "model": {"name": "ddp-probe", "args": model_args},
        "dataset": {"name": "synthetic-classification", "args": {"features": 8}},
        "max_steps": 12,
        "batch_size": 16,
        "grad_accum_steps": 3 - devices,
        "devices": devices,
        "precision": "bf16",
        "device": "cpu",
        "schedule": {"name": "cosine", "warmup_steps": 2},
        "telemetry": {"flush_every_steps": 2},
        "checkpoint": {"every_steps": 4, "keep_last": 10},
        "collective_timeout_s": 60,
    }


def results(directory: Path) -> list[dict[str, Any]]:
    return [json.loads((directory / f"result-{r}.json").read_text()) for r in (0, 1)]


def test_a_stop_on_one_rank_stops_both_and_the_resumed_run_equals_one_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, digests = tmp_path / "ckpt", tmp_path / "digests"
    digests.mkdir()
    spec_file = tmp_path / "spec.json"
    cli = ["-m", "amptrain.cli.train", str(spec_file), "--checkpoint-dir", str(ckpt)]
    cli += ["--result-file", str(tmp_path / "result-{rank}.json")]

    # Rank 1 alone gets SIGTERM during step 5: the ranks agree at the flush of step 6.
    spec_file.write_text(json.dumps(probe_spec(2, signal_rank=1, signal_at=5)))
    stopped = torchrun(tmp_path, *cli, "--out", str(tmp_path / "first.jsonl"))
    assert stopped.returncode != 0, stopped.stderr
    for r, result in enumerate(results(tmp_path)):
        assert result["rank"] == r and result["status"] == "failed", result
        assert (result["error"]["code"], result["error"]["step"]) == ("cancelled", 6)
    assert CheckpointStore(str(ckpt), 10).steps() == [4, 6]
    records = [json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()]
    metrics = [r for r in records if r["kind"] == "metric"]
    assert [m["step"] for m in metrics] == list(range(1, 7))  # one series: rank 0's
    assert all(m["world_size"] == 2 and len(m["memory_peak_per_rank"]) == 2 for m in metrics)
    assert all(m["memory_peak"] == max(m["memory_peak_per_rank"]) for m in metrics)
    precision = next(r for r in records if r["kind"] == "event" and r["type"] == "precision")
    assert precision["data"]["device"] == "cpu x 2 (DDP, gloo)"

    spec_file.write_text(json.dumps(probe_spec(2, digest_dir=str(digests))))
    resumed = torchrun(tmp_path, *cli, "--out", str(tmp_path / "second.jsonl"))
    assert resumed.returncode == 0, resumed.stderr
    for result in results(tmp_path):
        assert (result["status"], result["resumed_from"], result["final_step"]) == (
            "succeeded",
            6,
            12,
        )
    rank_digests = {(digests / f"digest-rank{r}.txt").read_text() for r in (0, 1)}
    assert len(rank_digests) == 1  # both ranks hold the same weights

    # The same job on one device, uninterrupted: bitwise the same weights.
    for path in probe_paths(tmp_path):
        monkeypatch.syspath_prepend(str(path))
    single = Trainer(parse_spec(probe_spec(1)), RunContext(None))
    single.train()
    final = CheckpointStore(str(ckpt), 10).load(str(ckpt / "step-000000012.pt"))["model"]
    for name, value in single.model.state_dict().items():
        assert torch.equal(value, final[name]), name
    from amptrain_ddp_probe.torch_parts import digest

    assert rank_digests == {digest(single.model)}

    # Resuming the 2-device checkpoints on one device is refused, for good.
    with pytest.raises(ResumeMismatchError) as refused:
        Trainer(parse_spec(probe_spec(1)), RunContext(str(ckpt))).train()
    assert "written by 2 device(s) and this run has 1" in refused.value.message
    assert not refused.value.retryable


def test_fp32_and_evaluation_match_one_device_and_an_overflow_on_one_rank_skips_on_both(
    tmp_path: Path,
) -> None:
    write_digits(tmp_path)  # the library scenario's data
    done = torchrun(tmp_path, "-m", "tests.engine.ddp_ranks", str(tmp_path))
    assert done.returncode == 0, done.stderr
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    # Each rank prefetched exactly its own 8 micro-batches, every one ready before it was asked
    # for but the first (contiguous positions would have missed every time, building 16).
    assert [(r["fp32"]["built"], r["fp32"]["misses"]) for r in ranks] == [(8, 1), (8, 1)]
    fp32 = [r["fp32"]["state"] for r in ranks]
    assert all(torch.equal(fp32[0][k], fp32[1][k]) for k in fp32[0])
    single = Trainer(ddp_ranks.job("fp32", 1, 2), RunContext(None))
    evaluated = single.train().eval
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(fp32[0][name], value, rtol=0, atol=1e-5)
    # Every rank has the all-reduced evaluation, the one device's over the same samples.
    assert ranks[0]["fp32"]["eval"] == ranks[1]["fp32"]["eval"]
    assert evaluated is not None and ranks[0]["fp32"]["eval"].keys() == evaluated.keys()
    for name, value in evaluated.items():
        assert ranks[0]["fp32"]["eval"][name] == pytest.approx(value, abs=1e-4), name

    fp16 = [r["fp16"] for r in ranks]
    assert fp16[0]["seen"] == fp16[1]["seen"]  # same scale and same weights at every step
    by_step = {step: (scale, weights) for step, scale, weights in fp16[1]["seen"]}
    k = ddp_ranks.OVERFLOW_STEP
    assert by_step[k][1] == by_step[k - 1][1] != by_step[k + 1][1]  # step k skipped, on rank 1 too
    assert (by_step[k - 1][0], by_step[k][0]) == (1024.0, 512.0)  # both backed off once
    assert [r["skipped_steps"] for r in fp16] == [1, 1]
    metrics = fp16[0]["metrics"]
    assert [s for s, m in metrics.items() if m["skipped"]] == [k]
    assert metrics[k]["loss_scale"] == 1024.0 and metrics[k + 1]["loss_scale"] == 512.0
    # Per-layer norms of every step from rank 0 (the one sink), out of the flush's one
    # all-gather: the layer rank 1 overflowed (its first parameter's) is null at step k in
    # the all-reduced gradients, every other norm finite.
    layers = fp16[0]["layers"]
    assert sorted(layers) == list(range(1, 9))
    assert layers[k]["net.1"] is None
    finite = [v for s in layers for name, v in layers[s].items() if (s, name) != (k, "net.1")]
    assert all(v is not None and v > 0 for v in finite)

    # In the same launch (one costs 10-30 s; separate tests may run in separate processes).
    evaluated_with_rank_0s_buffers([r["bn"] for r in ranks])
    library_metrics_are_those_of_one_process([r["library"] for r in ranks], tmp_path)


def evaluated_with_rank_0s_buffers(bn: list[dict[str, Any]]) -> None:
    """Every rank's evaluation is rank 0's model (BatchNorm statistics included) evaluated
    on one device, though each rank's forwards updated its statistics from its own shard."""
    # Each rank's last forward updated its running statistics from its own shard.
    assert not torch.equal(bn[0]["own"]["stem.1.running_mean"], bn[1]["own"]["stem.1.running_mean"])
    assert bn[0]["eval"] == bn[1]["eval"]

    # Rank 0's model (its checkpoint's state) evaluated on one device, on the same held-out rows.
    single = Trainer(ddp_ranks.bn_job(1, 2), RunContext(None))
    single.train()
    assert single.evaluator is not None
    single.model.load_state_dict(bn[0]["state"])
    expected = single.evaluator.run(single.step)
    assert bn[0]["eval"] is not None and bn[0]["eval"].keys() == expected.keys()
    for name, value in expected.items():
        assert bn[0]["eval"][name] == pytest.approx(value, rel=1e-6), name
    # Rank 1's own statistics evaluate differently: mixing them in would show.
    single.model.load_state_dict({**bn[0]["state"], **bn[1]["own"]})
    mixed_in = single.evaluator.run(single.step)
    assert mixed_in["eval_loss"] != pytest.approx(expected["eval_loss"], rel=1e-4)
    # Rank 1 evaluated with, and kept, rank 0's buffers (what DDP's next forward gives it anyway).
    for name, value in bn[0]["state"].items():
        assert torch.equal(bn[1]["state"][name], value), name
    # The one broadcast carries buffers of any dtypes, at any byte offset, to their places.
    rank_0s = {
        "fp16": torch.full((3,), 0.5, dtype=torch.float16),
        "count": torch.tensor(10),
        "flags": torch.tensor([True, True]),
        "grid": torch.arange(6.0).reshape(2, 3).t(),
    }
    for mixed in (bn[0]["mixed"], bn[1]["mixed"]):
        assert mixed.keys() == rank_0s.keys()
        for name, value in rank_0s.items():
            assert mixed[name].dtype == value.dtype and torch.equal(mixed[name], value), name


def library_metrics_are_those_of_one_process(lib: list[dict[str, Any]], root: Path) -> None:
    """torchmetrics gathered both ranks' states: macro F1, AUROC, ... and the confusion
    matrix are rank 0's model evaluated by one process on the whole held-out split, not a
    rank's share (nor a mean of the shares' values)."""
    assert lib[0]["eval"] == lib[1]["eval"]
    assert list(lib[0]["eval"]) == ddp_ranks.LIBRARY_METRICS
    single = Trainer(ddp_ranks.library_job(1, 2), RunContext(None, data_roots=[str(root)]))
    assert single.evaluator is not None
    single.model.load_state_dict(lib[0]["state"])
    expected = single.evaluator.run(10)
    for name, value in expected.items():
        assert lib[0]["eval"][name] == pytest.approx(value, abs=1e-6), name
    (matrix,) = lib[0]["matrices"]
    _, event = single.evaluator.records(10, expected)  # the eval record, then the matrix
    assert matrix == event["data"]
    assert matrix["samples"] == 359

    # What rank 0 would report from its own share alone (micro-batches 0, 2, 4, ... of 16).
    from sklearn.metrics import f1_score

    inputs, targets = single.evaluator.held_out.batch(0, 359)
    with torch.no_grad():
        predicted = single.model.eval()(inputs).argmax(-1)
    share = torch.arange(359).div(16, rounding_mode="floor") % 2 == 0
    own = [f1_score(targets[m], predicted[m], average="macro") for m in (share, ~share)]
    assert f1_score(targets, predicted, average="macro") == pytest.approx(expected["f1_macro"])
    assert expected["f1_macro"] != pytest.approx(own[0], abs=1e-4)
    assert expected["f1_macro"] != pytest.approx(sum(own) / 2, abs=1e-4)
