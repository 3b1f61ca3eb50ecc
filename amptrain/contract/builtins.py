"""The built-in components and choices a job spec can name, declared once.

Torch-free: each :class:`Registration` names its builder as a ``"module:attribute"``
string, so declaring (and listing, and validating against) a component never imports
torch. Argument bounds here are what ``GET /catalog`` shows and what submissions are
checked against; ``footprint``/``parameters`` let the API size a job from its spec
(``amptrain.contract.sizing``).
"""

from __future__ import annotations

from typing import Any

from amptrain.contract import sizing
from amptrain.contract.file_datasets import FILE_DATASETS
from amptrain.contract.registration import REQUIRED, Arg, Registration
from amptrain.contract.spec import MAX_SEED
from amptrain.contract.zoo_text import TEXT_MODELS
from amptrain.contract.zoo_vision import VISION_MODELS


def _model(name: str, builder: str, description: str, *args: Arg, **kw: Any) -> Registration:
    return Registration(name, "model", builder, description, args, **kw)


def _dataset(name: str, builder: str, description: str, *args: Arg, **kw: Any) -> Registration:
    return Registration(name, "dataset", builder, description, args, **kw)


_M = "amptrain.components.models"
_D = "amptrain.components.synthetic"
_DI = "amptrain.components.synthetic_images"
_DATA_SEED = Arg(
    "data_seed",
    0,
    "Seeds the task itself (teacher, patterns, chain); the job seed orders samples.",
    minimum=0,
    maximum=MAX_SEED,
)
_DROPOUT = Arg("dropout", 0.0, "Dropout probability.", minimum=0, maximum=0.99)
_CLASSES = Arg("classes", 10, "Number of classes.", minimum=2, maximum=100_000)


def _pool(default: int, things: str) -> Arg:
    """A synthetic dataset's pool size (held in memory, so bounded the same for all)."""
    return Arg(
        "num_samples",
        default,
        f"{things} in the pool; each epoch visits them in a new order.",
        minimum=1,
        maximum=10_000_000,
    )


BUILTIN_MODELS: tuple[Registration, ...] = (
    _model(
        "mlp",
        f"{_M}:build_mlp",
        "Multi-layer perceptron with GELU and LayerNorm; flattens its input.",
        Arg("width", 256, "Hidden units per layer.", minimum=1, maximum=65_536),
        Arg("depth", 2, "Hidden layers.", minimum=1, maximum=64),
        _DROPOUT,
        accepts=("vectors", "images"),
        parameters=sizing.mlp_parameters,
    ),
    _model(
        "cnn",
        f"{_M}:build_cnn",
        "Small ResNet: a conv stem, residual blocks with BatchNorm (channels double and "
        "resolution halves after the first), global average pooling, a linear head.",
        Arg("width", 32, "Channels of the stem and first block.", minimum=1, maximum=1024),
        Arg("depth", 3, "Residual blocks.", minimum=1, maximum=8),
        accepts=("images",),
        parameters=sizing.cnn_parameters,
    ),
    _model(
        "transformer",
        f"{_M}:build_transformer",
        "Small GPT-style causal language model: token + position embeddings, pre-LayerNorm "
        "blocks with causal self-attention, a head tied to the token embedding.",
        Arg("d_model", 128, "Embedding width; n_heads must divide it.", minimum=1, maximum=16_384),
        Arg("n_layers", 2, "Transformer blocks.", minimum=1, maximum=256),
        Arg("n_heads", 4, "Attention heads.", minimum=1, maximum=256),
        Arg("mlp_ratio", 4, "Feed-forward width as a multiple of d_model.", minimum=1, maximum=16),
        _DROPOUT,
        accepts=("tokens",),
        parameters=sizing.transformer_parameters,
        rules=lambda a: (
            []
            if a["d_model"] % a["n_heads"] == 0
            else [("n_heads", f"must divide d_model ({a['d_model']}); got {a['n_heads']}")]
        ),
    ),
    *TEXT_MODELS,
    *VISION_MODELS,
)

BUILTIN_DATASETS: tuple[Registration, ...] = (
    _dataset(
        "synthetic-classification",
        f"{_D}:build_synthetic_classification",
        "Gaussian feature vectors labelled by a fixed random two-layer teacher network.",
        Arg("features", 32, "Features per sample.", minimum=1, maximum=16_384),
        _CLASSES,
        _pool(8192, "Samples"),
        _DATA_SEED,
        Arg(
            "feature_scale",
            1.0,
            "Multiplies every feature (the labels stay the same): 1e6 exceeds fp16's range "
            "(65504) but not bf16's or fp32's, to see health.fallback at work.",
            minimum=1e-6,
            maximum=1e30,
        ),
        provides="vectors",
        footprint=sizing.classification_footprint,
    ),
    _dataset(
        "synthetic-images",
        f"{_DI}:build_synthetic_images",
        "Images of any size: a smooth class-specific pattern, randomly shifted, plus noise. "
        "Every sample is distinct (generated from its index).",
        Arg("channels", 3, "Image channels.", minimum=1, maximum=64),
        Arg("height", 32, "Image height in pixels.", minimum=4, maximum=4096),
        Arg("width", 32, "Image width in pixels.", minimum=4, maximum=4096),
        _CLASSES,
        Arg(
            "noise",
            0.5,
            "Standard deviation of the per-pixel noise (the pattern has std 1).",
            minimum=0,
            maximum=100,
        ),
        _DATA_SEED,
        provides="images",
        footprint=sizing.images_footprint,
    ),
    _dataset(
        "synthetic-text",
        f"{_D}:build_synthetic_text",
        "Token sequences from a fixed random Markov chain in which each token has a few "
        "likely successors; targets are the next tokens.",
        Arg("vocab_size", 64, "Vocabulary size.", minimum=2, maximum=32_768),
        Arg("seq_len", 32, "Tokens per sample (model context length).", minimum=2, maximum=65_536),
        Arg(
            "branching",
            2,
            "Likely successors per token (lower = more learnable).",
            minimum=1,
            maximum=1024,
        ),
        _pool(4096, "Sequences"),
        _DATA_SEED,
        provides="tokens",
        footprint=sizing.text_footprint,
    ),
    _dataset(
        "tensors",
        "amptrain.components.tensors_dataset:build_tensors",
        "Your data from a .npz, .csv or .pt file under one of the service's data roots "
        "(shared by every user, or one sub-directory per user where the service is set up "
        "so). A relative path is looked up under the data roots; an absolute path or URL "
        "must lie under one; URLs only with a protocol the service allows (default: local "
        "files only). Classification: inputs and integer labels (CSV: numeric columns, the "
        "label in label_column, an optional header). Language model: token ids of shape "
        "(N, seq_len + 1); targets are the inputs shifted by one. Sequence classification: "
        "token ids of shape (N, seq_len) and one label each (the vocabulary is the largest "
        "id + 1). A .pt file holds "
        "tensors (one, an (inputs, targets) pair or a dict of them) in the zip format "
        "torch.save writes, never Python lists of numbers.",
        Arg(
            "path",
            REQUIRED,
            "File path (relative to a data root, or absolute) or URL (.npz, .csv or .pt).",
            type="str",
            path=True,
        ),
        Arg(
            "task",
            "classification",
            "What the file holds.",
            choices=("classification", "language_model", "sequence_classification"),
        ),
        Arg("inputs_key", "x", "Array name of the inputs in a .npz or .pt dict.", max_length=200),
        Arg(
            "targets_key",
            "y",
            "Array name of the labels in a .npz or .pt dict (classification).",
            max_length=200,
        ),
        Arg(
            "label_column",
            -1,
            "CSV column holding the label (negative counts from the end).",
            minimum=-65_536,
            maximum=65_535,
        ),
        Arg(
            "num_classes",
            0,
            "Classes or vocabulary size; 0 = largest value + 1.",
            minimum=0,
            maximum=10_000_000,
        ),
        Arg(
            "val_path",
            "",
            "Held-out file (same format and keys as path, checked against the same data "
            "roots); empty = none, or val_fraction.",
            type="str",
            path=True,
        ),
        Arg(
            "val_fraction",
            0.0,
            "Fraction of path's rows held out for evaluation, drawn by a seed fixed per "
            "file and left out of training; 0 = none (or val_path).",
            minimum=0,
            maximum=0.5,
        ),
    ),
    *FILE_DATASETS,
)

OPTIMIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "adamw": (
        "AdamW with decoupled weight decay (fused on CUDA).",
        ("lr", "weight_decay", "betas", "eps"),
    ),
    "sgd": ("SGD with momentum.", ("lr", "weight_decay", "momentum")),
}
SCHEDULES: dict[str, str] = {
    "cosine": "Linear warm-up, then cosine decay to min_lr_ratio x lr.",
    "linear": "Linear warm-up, then linear decay to min_lr_ratio x lr.",
    "constant": "Linear warm-up, then constant.",
}
PRECISIONS: dict[str, str] = {
    "auto": "Measures the job's model for a few steps (about 2 s): bf16 vs tf32 on CUDA "
    ">= 8.0, fp16 vs fp32 on 7.x, bf16 vs fp32 on a CPU; the low precision when >= 1.1x "
    "faster with a finite loss. Unmeasurable: bf16 on CUDA >= 8.0, fp16 + loss scaling on "
    "7.x, fp32 below; on a CPU bf16 with AMX (or avx512_bf16 measured >= 1.2x), else fp32.",
    "fp32": "Strict IEEE fp32 (TF32 off for matmuls and convolutions).",
    "tf32": "fp32 with TF32 tensor-core matmuls and convolutions (CUDA capability >= 8.0; "
    "IEEE fp32 elsewhere).",
    "fp16": "float16 autocast with dynamic loss scaling (GradScaler).",
    "bf16": "bfloat16 autocast, no loss scaling; needs native support (CUDA >= 8.0 or a CPU).",
}
