"""The libraries' models under data parallelism: 2 ranks on gloo (CPU), started by torchrun
as the service starts them. A torchvision network (BatchNorm buffers, which DDP broadcasts
from rank 0) and a transformers GPT-2 (wrapped, its head tied to the token table) each
train to the weights one device reaches accumulating the same micro-batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from tests.engine.test_ddp import results, torchrun

pytestmark = pytest.mark.slow

MODELS = {
    "torchvision": (
        {"name": "resnet18"},  # BatchNorm, no dropout (ranks draw other masks)
        {"name": "synthetic-images", "args": {"height": 32, "width": 32, "classes": 4}},
    ),
    "transformers": (
        {
            "name": "hf-causal-lm",
            "args": {"model_type": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        },
        {"name": "synthetic-text", "args": {"vocab_size": 64, "seq_len": 16}},
    ),
}


def spec(family: str, devices: int) -> dict[str, Any]:
    model, dataset = MODELS[family]
    return {
        "model": model,
        "dataset": dataset,
        "max_steps": 2,
        "batch_size": 8,
        "grad_accum_steps": 3 - devices,
        "devices": devices,
        "precision": "fp32",
        "device": "cpu",
        "seed": 4,
        "checkpoint": {"every_steps": 2, "keep_last": 1},
        "collective_timeout_s": 60,
        "eval": {"batches": 1},  # after the last step: the weights compared are already final
    }


@pytest.mark.parametrize("family", sorted(MODELS))
def test_two_ranks_reach_the_weights_of_one_device(tmp_path: Path, family: str) -> None:
    ckpt, spec_file = tmp_path / "ckpt", tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec(family, 2)))
    cli = ["-m", "amptrain.cli.train", str(spec_file), "--checkpoint-dir", str(ckpt)]
    run = torchrun(tmp_path, *cli, "--result-file", str(tmp_path / "result-{rank}.json"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["status"] for r in results(tmp_path)] == ["succeeded", "succeeded"]
    final = CheckpointStore(str(ckpt), 1).load(str(ckpt / "step-000000002.pt"))["model"]

    single = Trainer(parse_spec(spec(family, 1)), RunContext(None))
    single.train()
    # Parameters only: one device updates BatchNorm's running statistics on both
    # micro-batches, the ranks each on its own (and DDP keeps rank 0's).
    for name, value in single.model.named_parameters():
        assert torch.allclose(value.detach(), final[name], rtol=1e-4, atol=1e-6), name
