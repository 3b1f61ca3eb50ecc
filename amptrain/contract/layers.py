"""Per-layer gradient norms as named series (``telemetry.layer_grad_norms_every``): what a
layer is, how it is named, and how many a job may have. Defined once: the engine groups by
:func:`layer_paths`, the recorder checks names with :func:`check_layer_path`, both command
lines print :func:`layer_line`.

Torch-free and dependency-free: every process imports it.
"""

from __future__ import annotations

import math
import re

LAYER_NORMS_MAX = 256
"""The most layers a job records gradient norms for (``telemetry.layer_grad_norms_every``):
a model with more parameter-holding modules is grouped by shorter module paths (see
:func:`layer_paths`)."""
LAYER_NORMS_READ_VALUES = 100_000
"""The most norms (steps x layers) one downsampled read of a job's layer norms returns:
``GET /jobs/{id}/layer-norms?max_points=N`` keeps fewer steps than N when the job's layers
x N would pass it (about 3 MB of JSON; 1,000 steps of 100 layers)."""
LAYER_PATH_MAX = 128
"""The longest layer name (a module path, ``blocks.3.attn``) a layer-norm series may have."""
ROOT_LAYER = "(root)"
"""The layer name of parameters registered on the model itself (no module path)."""
LAYER_PATH = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.]{{0,{LAYER_PATH_MAX - 1}}}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")


def check_layer_path(name: str) -> str:
    """``name`` if it can name a layer-norm series (a module path of letters, digits, ``_``
    and ``.``, at most :data:`LAYER_PATH_MAX` characters, or :data:`ROOT_LAYER`), else
    ValueError saying why."""
    if name == ROOT_LAYER or (isinstance(name, str) and LAYER_PATH.fullmatch(name)):
        return name
    raise ValueError(
        f"layer name {name!r}: a module path of letters, digits, _ and ., at most "
        f"{LAYER_PATH_MAX} characters"
    )


def layer_paths(params: list[str] | tuple[str, ...]) -> list[str]:
    """Each parameter's layer: its module path (the name without its last component,
    ``blocks.3.attn.proj.weight`` -> ``blocks.3.attn.proj``), so a job has one series per
    parameter-holding module. Past :data:`LAYER_NORMS_MAX` distinct layers (or a path
    longer than :data:`LAYER_PATH_MAX`), paths are cut to fewer components, the deepest
    cut that fits (``blocks.3.attn.proj`` -> ``blocks.3``): every parameter stays in some
    layer's norm. Should even the top-level modules not fit, the parameters of those past
    the first :data:`LAYER_NORMS_MAX` in registration order are left out (their layer is
    ``""``). A character a module path may not hold (a ``ModuleDict`` key's ``-``) reads
    as ``_``."""
    parts = [_UNSAFE.sub("_", p).split(".")[:-1] for p in params]
    deepest = max((len(x) for x in parts), default=0)
    for depth in range(deepest, 0, -1):
        paths = [".".join(x[:depth]) or ROOT_LAYER for x in parts]
        if len(set(paths)) <= LAYER_NORMS_MAX and all(len(p) <= LAYER_PATH_MAX for p in paths):
            return paths
    paths = [(x[0][:LAYER_PATH_MAX] if x else ROOT_LAYER) for x in parts]
    kept = set(list(dict.fromkeys(paths))[:LAYER_NORMS_MAX])
    return [p if p in kept else "" for p in paths]


def layer_line(step: int, values: dict[str, float | None], width: int | None = None) -> str:
    """``layer grad norms step 30 · 6 layers · max net.4 0.8 · min net.1 0.012``: the
    extremes only (a model may have :data:`LAYER_NORMS_MAX` layers); ``n/a`` when no norm
    was finite (an overflowing fp16 step). The minimum, then the maximum, are left out
    until the line fits ``width`` characters."""
    finite = [(v, n) for n, v in values.items() if v is not None and math.isfinite(v)]
    parts = [f"layer grad norms step {step}", f"{len(values)} layers"]
    if not finite:
        return " · ".join([*parts, "n/a"])
    (low, low_name), (high, high_name) = min(finite), max(finite)
    parts += [f"max {high_name} {high:.4g}", f"min {low_name} {low:.4g}"]
    while width is not None and len(parts) > 2 and len(" · ".join(parts)) > width:
        parts.pop()
    return " · ".join(parts)
