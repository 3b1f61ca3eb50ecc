"""torchvision and timm models train through the engine on tiny images (CPU, a few real
steps each): fp32 and bf16 for each family, an fp16 step with loss scaling for one model
of each, per-layer gradient norms named by the libraries' own module paths, and real photos
from a file (where a grey one is refused by the worker, which alone sees its shape)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

pytest.importorskip("torchvision")
pytest.importorskip("timm")
pytestmark = pytest.mark.heavy


def _train(model: dict[str, Any], precision: str, **extra: Any) -> ListSink:
    images = extra.pop("images", {})
    spec = parse_spec(
        {
            "model": model,
            "dataset": {
                "name": "synthetic-images",
                "args": {"channels": 3, "height": 32, "width": 32, "classes": 5, **images},
            },
            "max_steps": 2,
            "batch_size": 4,
            "precision": precision,
            "device": "cpu",
            # One held-out batch: the evaluation runs in each precision; its default 20
            # batches were most of a ViT's time (77 s of 112 s, loaded) and checked nothing more.
            "eval": {"batches": 1},
            **extra,
        }
    )
    sink = ListSink()
    result = Trainer(spec, RunContext(checkpoint_dir=None, sink=sink)).train()
    assert result.precision.effective == precision
    records = [r for r in sink.items if r["kind"] == "metric"]
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in records)
    assert [r["step"] for r in sink.items if r["kind"] == "eval"] == [2]  # it evaluated
    if precision == "fp16":
        assert all(r["loss_scale"] for r in records)
    else:
        assert not any(r["skipped"] for r in records)
    return sink


def _id(value: Any) -> str:
    if isinstance(value, dict):
        arch = value.get("args", {}).get("arch")
        return f"timm-{arch}" if arch else str(value["name"])
    return "-".join(value)


@pytest.mark.parametrize(
    ("model", "precisions"),
    [
        ({"name": "resnet18"}, ("fp32", "bf16", "fp16")),
        ({"name": "resnet50"}, ("bf16",)),
        ({"name": "mobilenet_v3_small"}, ("bf16",)),
        ({"name": "efficientnet_b0"}, ("fp32",)),
        (
            {"name": "timm", "args": {"arch": "resnet18", "drop_rate": 0.2}},
            ("fp32", "bf16", "fp16"),
        ),
        ({"name": "timm", "args": {"arch": "convnext_atto", "drop_path_rate": 0.1}}, ("bf16",)),
    ],
    ids=_id,
)
def test_each_family_trains_a_few_steps(model: dict[str, Any], precisions: tuple[str, ...]) -> None:
    for precision in precisions:
        _train(model, precision)


def test_vision_transformers_take_the_datasets_image_size() -> None:
    """A ViT is built for the dataset's images (its position embedding follows the size),
    timm's for any channel count."""
    _train({"name": "vit_b_32"}, "bf16", images={"height": 64, "width": 64})  # 4 patches
    tiny = {"name": "timm", "args": {"arch": "vit_tiny_patch16_224"}}
    _train(tiny, "fp32", images={"channels": 1, "height": 32, "width": 48})


def test_layer_norms_are_named_by_the_libraries_module_paths() -> None:
    telemetry = {"flush_every_steps": 1, "layer_grad_norms_every": 1}
    sink = _train({"name": "resnet18"}, "fp32", telemetry=telemetry)
    (first, *_) = [r for r in sink.items if r["kind"] == "layer_grad_norm"]
    names = set(first["values"])
    assert {"conv1", "bn1", "layer1.0.conv1", "layer4.1.bn2", "fc"} <= names
    assert all(v is not None and math.isfinite(v) and v >= 0 for v in first["values"].values())


def _photo_crops(channels: int) -> tuple[np.ndarray, np.ndarray]:
    """32x32 crops of scikit-learn's two sample photos, labelled by photo (real images)."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images  # two 427x640 RGB photos
    rng = np.random.default_rng(0)
    crops, labels = [], []
    for label, photo in enumerate(photos):
        for _ in range(16):
            y, x = rng.integers(0, 427 - 32), rng.integers(0, 640 - 32)
            crops.append(photo[y : y + 32, x : x + 32].transpose(2, 0, 1)[:channels])
            labels.append(label)
    x = (np.stack(crops).astype(np.float32) - 128) / 64
    return x, np.array(labels, dtype=np.int64)


def test_photos_from_a_file_train_and_a_grey_file_is_refused_naming_the_model(
    tmp_path: Path,
) -> None:
    """A file's shape is known only once the worker reads it: a torchvision net trains on
    real RGB crops, and grey ones get a clear refusal before anything is built."""
    pytest.importorskip("sklearn")
    for channels in (3, 1):
        x, y = _photo_crops(channels)
        np.savez(tmp_path / f"photos{channels}.npz", x=x, y=y)
    spec = {
        "model": {"name": "resnet18"},
        "max_steps": 3,
        "batch_size": 8,
        "precision": "bf16",
        "device": "cpu",
    }
    sink = ListSink()
    rgb = parse_spec({**spec, "dataset": {"name": "tensors", "args": {"path": "photos3.npz"}}})
    Trainer(rgb, RunContext(checkpoint_dir=None, sink=sink, data_roots=[str(tmp_path)])).train()
    losses = [r["loss"] for r in sink.items if r["kind"] == "metric"]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    grey = parse_spec({**spec, "dataset": {"name": "tensors", "args": {"path": "photos1.npz"}}})
    with pytest.raises(InvalidSpecError) as err:
        Trainer(grey, RunContext(checkpoint_dir=None, data_roots=[str(tmp_path)])).train()
    assert err.value.message == (
        "model.name: model resnet18 takes 3-channel (RGB) images, as torchvision builds it, "
        "but the dataset yields images of shape 1x32x32"
    )
