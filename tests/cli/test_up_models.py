"""The models teams already use, through `amptrain up` (issue 38's "done when"): a
torchvision network (MobileNetV3), a timm network and a transformers causal LM each train on
the CPU with a held-out evaluation, and each precision (fp32, bf16, fp16) is some family's;
one job's checkpoint, exported as safetensors, starts a second job whose weights before its
first step are the first job's final weights bit for bit (with the library's own parameter
names). Every family in every precision is trained by the engine in
tests/components/test_vision_training.py and tests/components/test_hf_models.py; here the
service's path, the same whatever the pair, takes three jobs instead of nine (each of them a
training process importing its library: the nine were this test's 90 s of CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests.support.stack import wait_until
from tests.support.up import finished_job, start_up

pytestmark = pytest.mark.slow

IMAGES = {
    "name": "synthetic-images",
    "args": {"channels": 3, "height": 32, "width": 32, "classes": 4},
}
TEXT = {"name": "synthetic-text", "args": {"vocab_size": 64, "seq_len": 16}}
GPT2 = {
    "name": "hf-causal-lm",
    "args": {"model_type": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2},
}
FAMILIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "torchvision": ({"name": "mobilenet_v3_small"}, IMAGES),  # light: fp16 convs are emulated
    "timm": ({"name": "timm", "args": {"arch": "convnext_atto"}}, IMAGES),
    "transformers": (GPT2, TEXT),
}
# Each family once and each precision once. fp16 goes to the transformer: CPUs without
# AVX-512 emulate fp16 (and bf16) convolutions, and its loss scaling is the one to prove.
PRECISION = {"torchvision": "fp32", "timm": "bf16", "transformers": "fp16"}
accuracy = {"torchvision": "accuracy", "timm": "accuracy", "transformers": "token_accuracy"}


def job(model: dict[str, Any], dataset: dict[str, Any], precision: str, **extra: Any) -> dict:
    return {
        "name": f"{model['name']}-{precision}",
        "model": model,
        "dataset": dataset,
        "precision": precision,
        "device": "cpu",
        "batch_size": 4,
        "max_steps": 2,
        "seed": 5,
        "eval": {"batches": 1},  # the task's own metrics: accuracy, or token accuracy
        **extra,
    }


# 94-144 s in full suites here; the default 300 s is too near on a slower CI machine.
@pytest.mark.timeout(600)
def test_library_models_train_in_every_precision_and_fine_tune_from_an_export(
    tmp_path: Path,
) -> None:
    up = start_up(tmp_path, tmp_path / "data", args=("--slots", "2"))
    try:
        client = up.admin_client()
        catalog = client.get("/catalog").json()["models"]
        assert {"mobilenet_v3_small", "timm", "hf-causal-lm"} <= set(catalog), sorted(catalog)
        ids = {}
        for family, (model, data) in FAMILIES.items():
            r = client.post("/jobs", json=job(model, data, PRECISION[family]))
            assert r.status_code == 201, r.text
            ids[family] = r.json()["id"]
        for family, job_id in ids.items():
            precision = PRECISION[family]
            done = finished_job(client, job_id, 600)
            assert done["status"] == "succeeded", (family, precision, done["error"], up.tail())
            assert done["precision"]["effective"] == precision, (family, done["precision"])
            evals = wait_until(
                lambda job_id=job_id: client.get(f"/jobs/{job_id}/evals").json()["items"],
                60,
                "the final evaluation",
            )
            values = evals[-1]["values"]
            assert evals[-1]["step"] == 2 and {"eval_loss", accuracy[family]} <= set(values)

        # Fine-tuning round trip: the GPT-2's final checkpoint (fp32 weights: autocast and
        # loss scaling leave the parameters in fp32) into the weights root.
        first = ids["transformers"]
        exported = client.post(f"/jobs/{first}/checkpoints/2/export", json={"name": "gpt2-a"})
        assert exported.status_code == 201, exported.text
        path = exported.json()["path"]
        final = _weights(client, first, 2)
        assert "transformer.h.0.attn.c_attn.weight" in final  # the library's own names
        second = client.post(
            "/jobs", json=job(GPT2, TEXT, "bf16", weights={"path": path}, seed=11)
        ).json()["id"]
        assert finished_job(client, second, 600)["status"] == "succeeded", up.tail()
        start = _weights(client, second, 0)  # checkpointed before its first optimizer step
        assert start.keys() == final.keys()
        for name, tensor in final.items():
            assert torch.equal(start[name], tensor), name
    finally:
        up.stop()


def _weights(client: Any, job_id: str, step: int) -> dict[str, torch.Tensor]:
    r = client.get(f"/jobs/{job_id}/checkpoints/{step}", params={"format": "safetensors"})
    assert r.status_code == 200, r.text
    return safetensors.torch.load(r.content)
