"""How big a job is, estimated from its spec alone (torch-free, so the API can ask).

A built-in dataset declares a *footprint*: the shape of one sample, the number of
classes (or the vocabulary) and roughly how much host memory the dataset holds
while it is built and used. A built-in model declares its exact *parameter
count* for that shape (``tests/contract/test_sizing.py`` checks each
formula against the real model built on PyTorch's ``meta`` device). Together they
give a lower bound of a job's memory that costs nothing to compute: the API
refuses a spec whose bound exceeds the service's limit before anything is queued.
The worker then checks the full estimate (activations included) against its own
device (``amptrain.engine.fit_check``).

Plugins may declare the same two functions on their :class:`Registration`; a
component without them is simply not estimated here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FLOAT = 4
LONG = 8


@dataclass(frozen=True)
class DataShape:
    """What a dataset yields, and what it keeps in memory."""

    input_shape: tuple[int, ...]
    classes: int
    """Classes, or the vocabulary size of a language-model dataset."""
    resident_bytes: int
    """Host memory the dataset needs while it is built and served (rough)."""
    vocab_size: int | None = None
    """Token-id inputs with class labels (data kind ``sequences``): their vocabulary."""


def optimizer_state_bytes(name: str, momentum: float = 0.0) -> int:
    """Bytes of optimizer state per fp32 parameter: AdamW keeps two moments, SGD one buffer."""
    if name == "adamw":
        return 2 * FLOAT
    return FLOAT if momentum else 0


def training_state_bytes(parameters: int, optimizer: str, momentum: float = 0.0) -> int:
    """fp32 weights + fp32 gradients + optimizer state (the part that never shrinks)."""
    return parameters * (2 * FLOAT + optimizer_state_bytes(optimizer, momentum))


def per_device_state_bytes(
    state_bytes: int, devices: int, parallelism: str, gathered_bytes: int = 0
) -> int:
    """The training state one device holds: all of it with ddp (every device a full copy);
    with fsdp its shard, ``1/devices`` of it, plus ``gathered_bytes``: the largest unit
    (block, or the root's own parameters) all-gathered whole for its forward and backward."""
    if parallelism != "fsdp" or devices == 1:
        return state_bytes
    return -(-state_bytes // devices) + gathered_bytes


def format_bytes(n: float) -> str:
    """``1.5 GiB``-style (binary units), for messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- built-in datasets -----------------------------------------------------------------


def held_out_size(num_samples: int) -> int:
    """Held-out samples a synthetic pool of ``num_samples`` adds after its training rows
    (one eighth, at least one): the one definition for the datasets and their footprints."""
    return max(1, num_samples // 8)


def classification_footprint(args: Mapping[str, Any]) -> DataShape:
    """Gaussian pool + teacher: x (n, f), w1 (f, 2f), w2 (2f, c) and ``x @ w1`` on the way
    (n counting the held-out rows)."""
    n, f, c = args["num_samples"], args["features"], args["classes"]
    n += held_out_size(n)
    floats = n * f + 2 * f * f + 2 * f * c + 2 * n * f + n * c
    return DataShape((f,), c, floats * FLOAT + n * LONG)


def images_footprint(args: Mapping[str, Any]) -> DataShape:
    """Class patterns (wrap-padded, plus the coarse/fine fields they are made of) and a
    bank of noise fields of the padded size (at least 8, about 16 MiB for small images)."""
    c, h, w, k = args["channels"], args["height"], args["width"], args["classes"]
    padded = c * (h + 2 * max(1, h // 8)) * (w + 2 * max(1, w // 8))
    fields = max(8, min(256, 2**22 // padded))
    floats = 3 * k * c * h * w + k * padded + fields * padded
    return DataShape((c, h, w), k, floats * FLOAT)


def text_footprint(args: Mapping[str, Any]) -> DataShape:
    """Markov chain (vocab x vocab), the token pool (n, seq_len + 1) and its shifted copies,
    and the (n, vocab) rows drawn from at every position while walking the chain."""
    v, n, t = args["vocab_size"], args["num_samples"], args["seq_len"]
    n += held_out_size(n)
    total = (v * v + n * v) * FLOAT + (3 * n * (t + 1)) * LONG
    return DataShape((t,), v, total)


# -- built-in models ---------------------------------------------------------------------


def mlp_parameters(data: DataShape, args: Mapping[str, Any]) -> int:
    width, depth, c = args["width"], args["depth"], data.classes
    first = math.prod(data.input_shape) * width + width + 2 * width  # Linear + LayerNorm
    hidden = (depth - 1) * (width * width + 3 * width)
    return first + hidden + width * c + c


def cnn_parameters(data: DataShape, args: Mapping[str, Any]) -> int:
    width, depth = args["width"], args["depth"]
    total = data.input_shape[0] * width * 9 + 2 * width  # stem conv (no bias) + BatchNorm
    cin = width
    for i in range(depth):
        cout = width * 2 ** min(i, 3)
        total += cin * cout * 9 + cout * cout * 9 + 4 * cout  # two 3x3 convs + two BatchNorms
        if i or cin != cout:
            total += cin * cout + 2 * cout  # projected shortcut
        cin = cout
    return total + cin * data.classes + data.classes


def transformer_parameters(data: DataShape, args: Mapping[str, Any]) -> int:
    d, layers, ratio = args["d_model"], args["n_layers"], args["mlp_ratio"]
    embeddings = data.classes * d + data.input_shape[0] * d  # head tied to the token table
    attention = (3 * d * d + 3 * d) + (d * d + d)
    mlp = (ratio * d * d + ratio * d) + (ratio * d * d + d)
    block = attention + mlp + 4 * d  # two LayerNorms
    return embeddings + layers * block + 2 * d


@dataclass(frozen=True)
class SpecSize:
    """The part of a job's memory the API can know from the spec."""

    parameters: int | None
    state_bytes: int
    """fp32 weights, gradients and optimizer state one device holds (0 when the parameters
    are unknown): with ``parallelism: fsdp`` its shard (the block it gathers is not known
    without torch: a lower bound)."""
    data_bytes: int
    """The dataset's resident host memory (0 when unknown, e.g. a file)."""

    @property
    def total(self) -> int:
        return self.state_bytes + self.data_bytes

    def describe(self) -> str:
        parts = []
        if self.parameters is not None:
            parts.append(
                f"{self.parameters:,} parameters need {format_bytes(self.state_bytes)} for "
                "weights, gradients and optimizer state per device"
            )
        if self.data_bytes:
            parts.append(f"the dataset holds about {format_bytes(self.data_bytes)}")
        return "; ".join(parts)
