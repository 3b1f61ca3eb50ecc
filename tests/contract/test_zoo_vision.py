"""torchvision and timm models by name: the curated lists exist in the installed
libraries, the torch-free parameter tables match the real models built on the meta device,
and specs a model cannot train are refused at submit naming the field."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch

from amptrain.components import registry
from amptrain.components.base import DataInfo
from amptrain.contract import catalog
from amptrain.contract.admission import spec_size
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.layers import LAYER_NORMS_MAX, check_layer_path, layer_paths
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.contract.zoo_vision import (
    TIMM_ARCHS,
    TORCHVISION_ARCHS,
    vit_patch,
)
from amptrain.contract.zoo_vision_sizes import TIMM_SIZES, TORCHVISION_SIZES

torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")


def _spec(model: dict[str, Any], **images: int) -> Any:
    dataset = {"name": "synthetic-images", "args": images}
    return parse_spec({"model": model, "dataset": dataset, "max_steps": 1})


def _errors(model: dict[str, Any], **images: int) -> list[tuple[str, str]]:
    spec = _spec(model, **images)
    return [(".".join(e["loc"]), e["msg"]) for e in catalog.validate_components(spec)]


def test_the_curated_architectures_are_the_libraries_own_names() -> None:
    assert set(TORCHVISION_ARCHS) <= set(torchvision.models.list_models(module=torchvision.models))
    assert set(TIMM_ARCHS) <= set(timm.list_models())
    assert set(TORCHVISION_SIZES) == set(TORCHVISION_ARCHS)
    assert set(TIMM_SIZES) == set(TIMM_ARCHS)
    models = catalog.catalog()["models"]
    assert set(TORCHVISION_ARCHS) | {"timm"} <= set(models)
    assert models["resnet50"]["accepts"] == ["images"]
    assert "25.6M parameters at 1000 classes" in models["resnet50"]["description"]
    arch = next(a for a in models["timm"]["args"] if a["name"] == "arch")
    assert arch["choices"] == list(TIMM_ARCHS)
    assert catalog.builtins("model")["resnet50"].requires == ("torchvision",)
    assert catalog.builtins("model")["timm"].requires == ("timm",)


def test_listing_and_validating_them_imports_neither_torch_nor_the_libraries() -> None:
    code = (
        "import sys, json\n"
        "from amptrain.contract.catalog import catalog, validate_components\n"
        "from amptrain.contract.spec import parse_spec\n"
        "json.dumps(catalog())\n"
        "for m in ({'name': 'resnet50'}, {'name': 'timm', 'args': {'arch': 'vit_tiny_patch16_224'}}):\n"
        "    validate_components(parse_spec({'model': m, 'dataset': {'name': 'synthetic-images'},"
        " 'max_steps': 1}))\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'timm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _cases() -> list[tuple[str, str, tuple[int, int, int], int]]:
    """(model, arch, image shape, classes): two per architecture, one at ImageNet's shape."""
    cases = []
    for arch in TORCHVISION_ARCHS:
        side = 2 * vit_patch(arch) or max(32, TORCHVISION_SIZES[arch][4])
        cases += [(arch, "", (3, 224, 224), 1000), (arch, "", (3, side, side), 7)]
    for arch in TIMM_ARCHS:
        patch = vit_patch(arch)
        odd = (5, 3 * patch, 2 * patch) if patch else (1, 40, 48)
        cases += [("timm", arch, (3, 224, 224), 1000), ("timm", arch, odd, 13)]
    return cases


@pytest.mark.parametrize(("name", "arch", "shape", "classes"), _cases())
def test_parameter_tables_match_the_real_models(
    name: str, arch: str, shape: tuple[int, int, int], classes: int
) -> None:
    model = {"name": name, "args": {"arch": arch} if arch else {}}
    channels, height, width = shape
    spec = _spec(model, channels=channels, height=height, width=width, classes=classes)
    assert catalog.validate_components(spec) == []
    size = spec_size(spec)
    assert size is not None
    with torch.device("meta"):
        real = registry.build_model(spec.model, DataInfo("classification", shape, classes))
    assert size.parameters == sum(p.numel() for p in real.parameters())


def test_torchvision_resnet50_is_the_catalogs_resnet50() -> None:
    spec = _spec({"name": "resnet50"}, classes=1000)
    assert spec_size(spec) is not None and spec_size(spec).parameters == 25_557_032  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("model", "images", "field", "message"),
    [
        (
            {"name": "timm", "args": {"arch": "no_such_net"}},
            {},
            "model.args.arch",
            "must be one of convnext_atto",
        ),
        (  # a real timm model, but outside the curated list
            {"name": "timm", "args": {"arch": "vit_large_patch16_224"}},
            {},
            "model.args.arch",
            "got 'vit_large_patch16_224'",
        ),
        (
            {"name": "timm", "args": {"drop_rate": 0.95}},
            {},
            "model.args.drop_rate",
            "must be <= 0.9; got 0.95",
        ),
        (
            {"name": "timm", "args": {"drop_path_rate": -0.1}},
            {},
            "model.args.drop_path_rate",
            "must be >= 0",
        ),
        (
            {"name": "resnet50", "args": {"pretrained": True}},
            {},
            "model.args.pretrained",
            "unexpected argument",
        ),
        (
            {"name": "resnet50"},
            {"channels": 1},
            "model.name",
            "model resnet50 takes 3-channel (RGB) images, as torchvision builds it, but "
            "dataset 'synthetic-images' yields 1x32x32",
        ),
        (
            {"name": "convnext_tiny"},
            {"height": 16, "width": 64},
            "model.name",
            "model convnext_tiny takes images of at least 32x32 pixels",
        ),
        (
            {"name": "vit_b_16"},
            {"height": 40, "width": 40},
            "model.name",
            "takes images whose sides are multiples of its patch size 16",
        ),
        (
            {"name": "vit_b_16"},
            {"height": 32, "width": 64},
            "model.name",
            "takes square images only",
        ),
        (
            {"name": "timm", "args": {"arch": "deit_tiny_patch16_224"}},
            {"height": 24, "width": 32},
            "model.name",
            "model timm (arch deit_tiny_patch16_224) takes images whose sides are multiples",
        ),
        (
            {"name": "timm", "args": {"arch": "convnext_atto"}},
            {"height": 8, "width": 8},
            "model.name",
            "(arch convnext_atto) takes images of at least 32x32 pixels",
        ),
    ],
)
def test_what_a_model_cannot_train_is_refused_at_submit_naming_the_field(
    model: dict[str, Any], images: dict[str, int], field: str, message: str
) -> None:
    errors = _errors(model, **images)
    assert len(errors) == 1 and errors[0][0] == field and message in errors[0][1], errors


def test_timm_takes_any_channel_count_and_vits_any_multiple_of_their_patch() -> None:
    assert _errors({"name": "timm"}, channels=1) == []
    assert _errors({"name": "timm", "args": {"arch": "vit_tiny_patch16_224"}}, width=64) == []


def test_the_worker_refuses_what_the_api_could_not_size() -> None:
    """A file dataset's shape is known only once read: the registry checks it before
    building (so a torchvision net never sees a 1-channel batch)."""
    with pytest.raises(InvalidSpecError) as err:
        registry.build_model(
            ComponentRef(name="resnet18"), DataInfo("classification", (1, 28, 28), 10)
        )
    assert str(err.value) == (
        "model.name: model resnet18 takes 3-channel (RGB) images, as torchvision builds it, "
        "but the dataset yields images of shape 1x28x28"
    )
    with pytest.raises(InvalidSpecError, match=r"model\.name: model timm \(arch vit_tiny"):
        registry.build_model(
            ComponentRef(name="timm", args={"arch": "vit_tiny_patch16_224"}),
            DataInfo("classification", (3, 20, 20), 10),
        )
    with pytest.raises(InvalidSpecError, match=r"model\.name: model 'resnet18' takes images"):
        registry.build_model(ComponentRef(name="resnet18"), DataInfo("classification", (8,), 10))


@pytest.mark.parametrize(
    ("name", "arch"),
    [
        ("efficientnet_b3", ""),
        ("vit_b_16", ""),
        ("swin_t", ""),
        ("densenet121", ""),
        ("timm", "convnext_nano"),
        ("timm", "deit_small_patch16_224"),
    ],
)
def test_per_layer_norms_group_the_libraries_parameter_names(name: str, arch: str) -> None:
    """``features.3.1.block.0.0.weight``, ``encoder.layers.encoder_layer_0.ln_1.weight``,
    ``cls_token``: every parameter lands in a layer with a valid series name, within the
    per-job limit."""
    ref = ComponentRef(name=name, args={"arch": arch} if arch else {})
    with torch.device("meta"):
        model = registry.build_model(ref, DataInfo("classification", (3, 32, 32), 10))
    paths = layer_paths([n for n, _ in model.named_parameters()])
    assert all(paths) and len(set(paths)) <= LAYER_NORMS_MAX
    assert all(check_layer_path(p) == p for p in paths)
