"""What can be trained: the registered models, datasets, optimizers and schedules.

Torch-free on purpose: the API lists and validates components with this module
and must never import torch (``tests/trainer_core/contract/test_catalog.py`` checks it). The torch
side lives in ``trainer_core.registry`` and ``trainer_core.components``; it
builds from the very same :class:`Registration` objects (``trainer_core.contract.registration``), so the
catalog, validation and construction cannot disagree about names or arguments.

Plugins
-------
Other packages add components through entry points in the groups
``amptrain.models`` and ``amptrain.datasets``. Each entry point names a
:class:`Registration` object; keep the module it lives in torch-free and point
``builder`` at the torch code with a ``"module:attribute"`` string, so loading the
registration stays cheap. The catalog lists plugins by entry-point name without
importing them; the registry loads them when a job uses one. See
``trainer_core/components/README.md`` and ``tests/plugins/amptrain_example_plugin``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

from trainer_core.contract.registration import (
    DATASET_GROUP,
    MODEL_GROUP,
    REQUIRED,
    Arg,
    Registration,
)
from trainer_core.contract.spec import ComponentRef, JobSpec, OptimizerSpec, ScheduleSpec


def _model(name: str, builder: str, description: str, *args: Arg, **kw: Any) -> Registration:
    return Registration(name, "model", builder, description, args, **kw)


def _dataset(name: str, builder: str, description: str, *args: Arg, **kw: Any) -> Registration:
    return Registration(name, "dataset", builder, description, args, **kw)


_M = "trainer_core.components.models"
_D = "trainer_core.components.synthetic"
_DATA_SEED = Arg(
    "data_seed",
    0,
    "Seeds the task itself (teacher, patterns, chain); the job seed orders samples.",
    minimum=0,
)

BUILTIN_MODELS: tuple[Registration, ...] = (
    _model(
        "mlp",
        f"{_M}:build_mlp",
        "Multi-layer perceptron with GELU and LayerNorm; flattens its input.",
        Arg("width", 256, "Hidden units per layer.", minimum=1),
        Arg("depth", 2, "Hidden layers.", minimum=1),
        Arg(
            "dropout", 0.0, "Dropout probability after each hidden layer.", minimum=0, maximum=0.99
        ),
        accepts=("vectors", "images"),
    ),
    _model(
        "cnn",
        f"{_M}:build_cnn",
        "Small ResNet: a conv stem, residual blocks with BatchNorm (channels double and "
        "resolution halves after the first), global average pooling, a linear head.",
        Arg("width", 32, "Channels of the stem and first block.", minimum=1),
        Arg("depth", 3, "Residual blocks.", minimum=1, maximum=8),
        accepts=("images",),
    ),
    _model(
        "transformer",
        f"{_M}:build_transformer",
        "Small GPT-style causal language model: token + position embeddings, pre-LayerNorm "
        "blocks with causal self-attention, a head tied to the token embedding.",
        Arg("d_model", 128, "Embedding width; n_heads must divide it.", minimum=1),
        Arg("n_layers", 2, "Transformer blocks.", minimum=1),
        Arg("n_heads", 4, "Attention heads.", minimum=1),
        Arg("mlp_ratio", 4, "Feed-forward width as a multiple of d_model.", minimum=1),
        Arg("dropout", 0.0, "Dropout probability.", minimum=0, maximum=0.99),
        accepts=("tokens",),
    ),
    _model(
        "resnet50",
        f"{_M}:build_resnet50",
        "torchvision's ResNet-50, untrained (the standard AMP benchmark; e.g. 3x224x224 images).",
        accepts=("images",),
        requires=("torchvision",),
    ),
)

BUILTIN_DATASETS: tuple[Registration, ...] = (
    _dataset(
        "synthetic-classification",
        f"{_D}:build_synthetic_classification",
        "Gaussian feature vectors labelled by a fixed random two-layer teacher network.",
        Arg("features", 32, "Features per sample.", minimum=1),
        Arg("classes", 10, "Number of classes.", minimum=2),
        Arg(
            "num_samples",
            8192,
            "Samples in the pool; each epoch visits them in a new order.",
            minimum=1,
        ),
        _DATA_SEED,
        provides="vectors",
    ),
    _dataset(
        "synthetic-images",
        f"{_D}:build_synthetic_images",
        "Images of any size: a smooth class-specific pattern, randomly shifted, plus noise. "
        "Every sample is distinct (generated from its index).",
        Arg("channels", 3, "Image channels.", minimum=1),
        Arg("height", 32, "Image height in pixels.", minimum=4),
        Arg("width", 32, "Image width in pixels.", minimum=4),
        Arg("classes", 10, "Number of classes.", minimum=2),
        Arg(
            "noise",
            0.5,
            "Standard deviation of the per-pixel noise (the pattern has std 1).",
            minimum=0,
        ),
        _DATA_SEED,
        provides="images",
    ),
    _dataset(
        "synthetic-text",
        f"{_D}:build_synthetic_text",
        "Token sequences from a fixed random Markov chain in which each token has a few "
        "likely successors; targets are the next tokens.",
        Arg("vocab_size", 64, "Vocabulary size.", minimum=2),
        Arg("seq_len", 32, "Tokens per sample (model context length).", minimum=2),
        Arg("branching", 2, "Likely successors per token (lower = more learnable).", minimum=1),
        Arg(
            "num_samples",
            4096,
            "Sequences in the pool; each epoch visits them in a new order.",
            minimum=1,
        ),
        _DATA_SEED,
        provides="tokens",
    ),
    _dataset(
        "tensors",
        "trainer_core.components.tensors_dataset:build_tensors",
        "Your data from a .npz, .csv or .pt file (local path or fsspec URL) under one of the "
        "data roots the worker allows. Classification: inputs and integer labels (CSV: "
        "numeric columns, the label in label_column, an optional header). Language model: "
        "token ids of shape (N, seq_len + 1); targets are the inputs shifted by one.",
        Arg("path", REQUIRED, "File path or fsspec URL (.npz, .csv or .pt).", type="str"),
        Arg(
            "task",
            "classification",
            "What the file holds.",
            choices=("classification", "language_model"),
        ),
        Arg("inputs_key", "x", "Array name of the inputs in a .npz or .pt dict."),
        Arg("targets_key", "y", "Array name of the labels in a .npz or .pt dict (classification)."),
        Arg("label_column", -1, "CSV column holding the label (negative counts from the end)."),
        Arg("num_classes", 0, "Classes or vocabulary size; 0 = largest value + 1.", minimum=0),
    ),
)

OPTIMIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "adamw": (
        "AdamW with decoupled weight decay (fused on CUDA).",
        ("lr", "weight_decay", "betas"),
    ),
    "sgd": ("SGD with momentum.", ("lr", "weight_decay", "momentum")),
}
SCHEDULES: dict[str, str] = {
    "cosine": "Linear warm-up, then cosine decay to min_lr_ratio x lr.",
    "linear": "Linear warm-up, then linear decay to min_lr_ratio x lr.",
    "constant": "Linear warm-up, then constant.",
}
PRECISIONS: dict[str, str] = {
    "auto": "bf16 on CUDA capability >= 8.0, fp16 + loss scaling on 7.x, fp32 below; on a CPU bf16 "
    "with AMX, or with avx512_bf16 when a short probe measures it >= 1.2x fp32, else fp32.",
    "fp32": "Strict IEEE fp32 (TF32 off for matmuls and convolutions).",
    "tf32": "fp32 with TF32 tensor-core matmuls and convolutions (CUDA capability >= 8.0; "
    "IEEE fp32 elsewhere).",
    "fp16": "float16 autocast with dynamic loss scaling (GradScaler).",
    "bf16": "bfloat16 autocast, no loss scaling; needs native support (CUDA >= 8.0 or a CPU).",
}


def builtins(kind: Literal["model", "dataset"]) -> dict[str, Registration]:
    """The built-in registrations of ``kind`` available here (torchvision-only ones need it)."""
    regs = BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS
    return {r.name: r for r in regs if r.available()}


def plugin_entry_points(kind: Literal["model", "dataset"]) -> dict[str, EntryPoint]:
    """Installed plugin entry points of ``kind`` by name; built-in names cannot be overridden."""
    group = MODEL_GROUP if kind == "model" else DATASET_GROUP
    taken = {r.name for r in (BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS)}
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        if ep.name not in taken:
            found.setdefault(ep.name, ep)
    return found


def registered_names(kind: Literal["model", "dataset"]) -> list[str]:
    return [*builtins(kind), *plugin_entry_points(kind)]


def _field_help(spec: type[OptimizerSpec] | type[ScheduleSpec], name: str) -> dict[str, Any]:
    f = spec.model_fields[name]
    default = f.default
    return {
        "name": name,
        "default": list(default) if isinstance(default, tuple) else default,
        "help": f.description,
    }


def catalog() -> dict[str, Any]:
    """Everything a job spec can name, with arguments, defaults and descriptions (JSON-ready).

    Plugins appear by entry-point name with ``source: "plugin"`` and the entry
    point's target; they are not imported, so their arguments are not listed.
    """

    def section(kind: Literal["model", "dataset"]) -> dict[str, Any]:
        out = {name: r.describe("builtin") for name, r in builtins(kind).items()}
        for name, ep in plugin_entry_points(kind).items():
            out[name] = {"name": name, "source": "plugin", "entry_point": ep.value, "args": None}
        return out

    return {
        "models": section("model"),
        "datasets": section("dataset"),
        "optimizers": {
            name: {
                "name": name,
                "description": d,
                "args": [_field_help(OptimizerSpec, a) for a in args],
            }
            for name, (d, args) in OPTIMIZERS.items()
        },
        "schedules": {
            name: {
                "name": name,
                "description": d,
                "args": [_field_help(ScheduleSpec, a) for a in ("warmup_steps", "min_lr_ratio")],
            }
            for name, d in SCHEDULES.items()
        },
        "precisions": {name: {"name": name, "description": d} for name, d in PRECISIONS.items()},
    }


def _error(loc: Sequence[str], msg: str) -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg}


def component_errors(
    field_name: str, kind: Literal["model", "dataset"], name: str, args: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], Registration | None]:
    regs = builtins(kind)
    if name in regs:
        reg = regs[name]
        return [_error((field_name, "args", a), m) for a, m in reg.arg_errors(args)], reg
    if name in plugin_entry_points(kind):
        return [], None  # a plugin checks its own arguments when it is built
    hint = ""
    missing = [
        r for r in (BUILTIN_MODELS if kind == "model" else BUILTIN_DATASETS) if r.name == name
    ]
    if missing:
        hint = f" ({name} needs {', '.join(missing[0].requires)}, which is not installed)"
    known = ", ".join(registered_names(kind))
    return [
        _error((field_name, "name"), f"unknown {kind} {name!r}{hint}; registered: {known}")
    ], None


def validate_components(spec: JobSpec) -> list[dict[str, Any]]:
    """Problems with the spec's model and dataset, as ``{"loc": [...], "msg": ...}``; empty = fine.

    Checks names, argument names, types and ranges, and that the model can consume
    what the dataset yields. Plugins' arguments are checked when they are built.
    """
    return validate_refs(spec.model, spec.dataset)


def validate_refs(
    model_ref: ComponentRef | None, dataset_ref: ComponentRef | None
) -> list[dict[str, Any]]:
    """Like :func:`validate_components` for whichever refs are known (e.g. when another
    part of the spec failed to parse, so every problem can be reported at once)."""
    errors: list[dict[str, Any]] = []
    model = data = None
    if model_ref is not None:
        found, model = component_errors("model", "model", model_ref.name, model_ref.args)
        errors += found
    if dataset_ref is not None:
        found, data = component_errors("dataset", "dataset", dataset_ref.name, dataset_ref.args)
        errors += found
    provides = data.provides if data is not None else None
    if (
        data is not None
        and data.name == "tensors"
        and dataset_ref
        and dataset_ref.args.get("task") == "language_model"
    ):
        provides = "tokens"
    if (
        model is not None
        and provides is not None
        and model.accepts
        and provides not in model.accepts
    ):
        assert dataset_ref is not None
        errors.append(
            _error(
                ("model", "name"),
                f"model {model.name!r} takes {' or '.join(model.accepts)}, but dataset "
                f"{dataset_ref.name!r} yields {provides}",
            )
        )
    return errors


__all__ = [
    "DATASET_GROUP",
    "MODEL_GROUP",
    "REQUIRED",
    "Arg",
    "Registration",
    "catalog",
    "validate_components",
    "validate_refs",
]
