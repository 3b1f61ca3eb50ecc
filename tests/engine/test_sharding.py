"""What fsdp shards and casts, and what it is expected to cost per device, without a process
group: each model family's blocks, the mixed-precision policy per precision, the worker's fit
estimate and the API's admission bound, and the shard directories' life in a checkpoint
directory. Training on 2 ranks: ``test_fsdp.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from amptrain.components.base import DataInfo
from amptrain.components.models import MLP, BasicBlock, Block, build_cnn, build_transformer
from amptrain.contract.admission import spec_size
from amptrain.contract.spec import parse_spec
from amptrain.engine.checkpoint import CheckpointMeta, CheckpointStore
from amptrain.engine.fit_check import estimate
from amptrain.engine.sharding import blocks, mixed_precision

IMAGES = DataInfo("classification", (3, 32, 32), 10)


def test_the_builtin_families_shard_their_repeated_blocks() -> None:
    tokens = DataInfo("language_model", (16,), 64)
    with torch.device("meta"):
        gpt = build_transformer(tokens, d_model=32, n_layers=3, n_heads=4)
        cnn = build_cnn(IMAGES, width=8, depth=3)
        mlp = MLP(64, 10, width=32, depth=3, dropout=0.0)
    assert [type(b) for b in blocks(gpt)] == [Block] * 3
    assert [type(b) for b in blocks(cnn)] == [BasicBlock] * 3
    # The MLP's hidden layers; its head stays with the root.
    assert blocks(mlp) == [mlp.net[1], mlp.net[5], mlp.net[9]]
    assert all(isinstance(b, nn.Linear) and b.out_features == 32 for b in blocks(mlp))


def test_library_models_shard_their_blocks_and_anything_else_only_its_root() -> None:
    torchvision = pytest.importorskip("torchvision")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        resnet = torchvision.models.resnet18(num_classes=10)
        vit = torchvision.models.vit_b_16(num_classes=10)
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64)
        gpt2 = transformers.GPT2LMHeadModel(config)
    assert [type(b).__name__ for b in blocks(resnet)] == ["BasicBlock"] * 8
    assert [type(b).__name__ for b in blocks(vit)] == ["EncoderBlock"] * 12
    assert [type(b).__name__ for b in blocks(gpt2)] == ["GPT2Block"] * 2  # its own declaration
    assert blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))) == []


@pytest.mark.parametrize(
    ("precision", "gathered"),
    [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", None), ("tf32", None)],
)
def test_the_policy_gathers_weights_in_the_jobs_precision_and_reduces_in_fp32(
    precision: str, gathered: torch.dtype | None
) -> None:
    policy = mixed_precision(precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (gathered, torch.float32)


def _spec(**fields: Any) -> Any:
    return parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 512, "depth": 4}},
            "dataset": {"name": "synthetic-classification", "args": {"features": 64}},
            "max_steps": 1,
            "batch_size": 16,
            "optimizer": {"name": "adamw"},
            **fields,
        }
    )


def test_the_fit_estimate_per_device_counts_fsdp_shards_and_one_gathered_block() -> None:
    info = DataInfo("classification", (64,), 10)
    single = estimate(_spec(), info, "bf16")
    ddp = estimate(_spec(devices=2), info, "bf16")
    fsdp = estimate(_spec(devices=2, parallelism="fsdp"), info, "bf16")
    assert single is not None and ddp is not None and fsdp is not None
    assert ddp.state_bytes == single.state_bytes  # every ddp device holds a full copy
    hidden = 512 * 512 + 512  # the largest block: one hidden Linear, gathered in bf16
    assert fsdp.state_bytes == single.state_bytes // 2 + hidden * 2
    assert fsdp.state_bytes < 0.6 * ddp.state_bytes
    assert fsdp.activation_bytes == ddp.activation_bytes  # activations are not sharded


def test_admission_bounds_fsdp_per_device() -> None:
    ddp, fsdp = spec_size(_spec(devices=2)), spec_size(_spec(devices=2, parallelism="fsdp"))
    assert ddp is not None and fsdp is not None and ddp.parameters == fsdp.parameters
    assert fsdp.state_bytes == ddp.state_bytes // 2
    assert "per device" in fsdp.describe()


def test_shards_are_removed_with_their_checkpoint_and_never_left_half_written(
    tmp_path: Any,
) -> None:
    store = CheckpointStore(str(tmp_path))
    for name in (".tmp-step-000000004.dcp", "step-000000006.dcp", "step-000000008.dcp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__0_0.distcp").write_bytes(b"shard")
    store.save(8, {"step": 8}, CheckpointMeta(8, True, 1))
    # The next writer: a temporary, and shards whose checkpoint file never came, are gone.
    CheckpointStore(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000008.dcp",
        "step-000000008.json",
        "step-000000008.pt",
    ]
    store.remove(8)
    assert list(tmp_path.iterdir()) == []
