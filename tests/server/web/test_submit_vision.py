"""A torchvision or timm model the spec cannot train is refused by the API at submit (a 422
naming the field), against a real API: the API process checks shapes and arguments from
the torch-free declarations."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.specs import mlp_job
from tests.support.stack import Stack

pytest.importorskip("torchvision")
pytest.importorskip("timm")


def _job(model: dict[str, Any], **images: int) -> dict[str, Any]:
    dataset = {"name": "synthetic-images", "args": images}
    return mlp_job(model=model, dataset=dataset)


def test_models_by_name_are_checked_at_submit(api_stack: Stack) -> None:
    client = api_stack.client
    refused = [
        (_job({"name": "resnet50"}, channels=1), "model.name", "takes 3-channel (RGB) images"),
        (
            _job({"name": "vit_b_16"}, height=40, width=40),
            "model.name",
            # whole: no part of it is shortened as if it quoted a long value
            "model vit_b_16 takes images whose sides are multiples of its patch size 16, but "
            "dataset 'synthetic-images' yields 3x40x40",
        ),
        (
            _job({"name": "timm", "args": {"arch": "vit_large_patch16_224"}}),
            "model.args.arch",
            "must be one of",
        ),
        (
            _job({"name": "timm", "args": {"drop_path_rate": 2}}),
            "model.args.drop_path_rate",
            "must be <= 0.9",
        ),
    ]
    for job, field, message in refused:
        r = client.post("/jobs", json=job)
        assert r.status_code == 422, r.text
        (problem,) = r.json()["detail"]
        assert problem["field"] == field and message in problem["message"], problem
    ok = _job({"name": "timm", "args": {"arch": "convnext_atto"}}, channels=1)
    assert client.post("/jobs", json=ok).status_code == 201
    catalog = client.get("/catalog").json()["models"]
    assert {"resnet50", "vit_b_16", "timm"} <= set(catalog)
