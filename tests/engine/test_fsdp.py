"""Sharded training (``parallelism: fsdp``): 2 ranks on gloo (CPU), started by torchrun.

One launch runs every scenario of ``fsdp_ranks.py`` in sequence (each launch costs two
``import torch``); the tests below read what each rank saved. Comparisons are against the
same job with ddp on the same 2 ranks, or the same fsdp job uninterrupted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.errors import ResumeMismatchError
from amptrain.engine import RunContext, Trainer
from tests.engine import fsdp_ranks
from tests.engine.test_ddp import torchrun

pytestmark = pytest.mark.slow

BF16_LOSS_RTOL = 5e-3
"""fsdp bf16 against ddp bf16: ddp keeps fp32 weights and autocast rounds them to bf16 per
matmul; fsdp gathers every weight in bf16 (LayerNorm and embedding weights too, which
autocast leaves in fp32), so the forward differs by bf16 rounding (2**-8 ~ 4e-3 relative per
value) and the losses of 8 steps by about that (measured: at most 7.5e-4)."""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("fsdp")
    done = torchrun(out, "-m", "tests.engine.fsdp_ranks", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))


def test_fsdp_bf16_shards_the_parameters_and_matches_ddp(
    ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    runs = ranks[1][0]["bf16"]
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert (ddp["param_types"], fsdp["param_types"]) == (["Parameter"], ["DTensor"])
    assert (ddp["device"], fsdp["device"]) == ("cpu x 2 (DDP, gloo)", "cpu x 2 (FSDP, gloo)")
    assert len(fsdp["losses"]) == 8 and fsdp["losses"][-1] < fsdp["losses"][0]  # it learns
    assert _worst(ddp["losses"], fsdp["losses"]) < BF16_LOSS_RTOL


def test_activation_checkpointing_recomputes_blocks_and_keeps_the_losses(
    ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    runs = ranks[1][0]["bf16"]
    for plain, checkpointed in (("ddp", "ddp_ac"), ("fsdp", "fsdp_ac")):
        # Each block's forward runs again in the backward: twice the forwards, 8 steps x 1.
        assert runs[plain]["first_block_forwards"] == 8
        assert runs[checkpointed]["first_block_forwards"] == 16
        # Recomputation repeats the same ops on the same inputs: the same losses (up to float
        # reassociation, none seen on the CPU).
        assert _worst(runs[plain]["losses"], runs[checkpointed]["losses"]) < 1e-6


def test_each_rank_holds_about_half_of_ddps_training_state(
    ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    for model in ("memory", "bf16"):
        ddp = [rank[model]["ddp"]["state_bytes"] for rank in ranks[1]]
        fsdp = [rank[model]["fsdp"]["state_bytes"] for rank in ranks[1]]
        # Parameters, gradients and AdamW's two moments, all fp32: every ddp rank holds all
        # of it, each fsdp rank about half (dim 0 split in two, a scalar such as AdamW's step
        # count on both), and the two halves make the whole. After an evaluation too: its
        # forwards leave no weights gathered.
        assert ddp[0] == ddp[1], (model, ddp)
        assert abs(sum(fsdp) - ddp[0]) < 0.001 * ddp[0], (model, ddp, fsdp)
        assert all(0.48 < f / ddp[0] < 0.52 for f in fsdp), (model, ddp, fsdp)
    mlp = ranks[1][0]["memory"]
    assert _worst(mlp["ddp"]["losses"], mlp["fsdp"]["losses"]) < BF16_LOSS_RTOL


def test_evaluation_over_uneven_shares_of_held_out_chunks_matches_ddp(
    ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    evals = [rank["memory"] for rank in ranks[1]]
    ddp, fsdp = evals[0]["ddp"]["eval"], evals[0]["fsdp"]["eval"]
    assert fsdp == evals[1]["fsdp"]["eval"]  # every rank has the same values
    assert ddp.keys() == fsdp.keys() and "eval_loss" in fsdp
    assert abs(ddp["eval_loss"] - fsdp["eval_loss"]) / ddp["eval_loss"] < BF16_LOSS_RTOL


def test_an_inf_in_one_ranks_shard_skips_the_step_on_both_with_one_loss_scale(
    ranks: tuple[Path, list[dict[str, Any]]],
) -> None:
    seen = [rank["fp16"]["seen"] for rank in ranks[1]]
    assert seen[0] == seen[1]  # (step, skipped, scale) the same on both ranks at every step
    skipped = [step for step, inf, _ in seen[0] if inf]
    assert skipped == [fsdp_ranks.OVERFLOW_STEP]
    scales = [scale for _, _, scale in seen[0]]
    assert scales == [1024.0] * fsdp_ranks.OVERFLOW_STEP + [512.0] * 2  # backed off once
    assert [rank["fp16"]["final_scale"] for rank in ranks[1]] == [512.0, 512.0]
    metrics = ranks[1][0]["fp16"]["metrics"]
    assert [s for s, m in metrics.items() if m["skipped"]] == [fsdp_ranks.OVERFLOW_STEP]
    assert all(math.isfinite(m["loss"]) for m in metrics.values())


def test_resuming_sharded_checkpoints_is_bitwise_exact_and_another_shape_is_refused(
    ranks: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, results = ranks
    for rank in results:
        whole, resumed = rank["resume"]["uninterrupted"], rank["resume"]["resumed"]
        assert resumed["stopped_at"] == resumed["resumed_from"] == 6  # the flush after 4
        assert resumed["losses"] == whole["losses"]  # every step's, bit for bit
        assert whole["weights"].keys() == resumed["weights"].keys()
        for name, value in whole["weights"].items():
            assert torch.equal(value, resumed["weights"][name]), name
            # The safetensors file beside the checkpoint holds them whole (gathered from the
            # shards), and a sharded job that starts from it holds them again.
            assert torch.equal(value, rank["resume"]["started_from_export"][name]), name
    files = results[0]["resume"]["resumed"]["files"]
    assert "step-000000008.dcp" in files and "step-000000008.pt" in files
    assert not [f for f in files if f.startswith(".tmp-")]
    # The same checkpoints resumed with ddp on the same 2 ranks: refused before any load.
    refused = results[0]["resume"]["ddp_refused"]
    assert refused is not None and "written with parallelism fsdp and this run uses ddp" in refused

    # On one device: refused for good, saying what to do.
    single = fsdp_ranks.mlp_job(devices=1, max_steps=10)
    with pytest.raises(ResumeMismatchError) as info:
        Trainer(single, RunContext(str(out / "ckpt"))).train()
    message = info.value.message
    assert "written by 2 device(s) and this run has 1" in message
    assert "Run with devices: 2" in message
    assert not info.value.retryable
