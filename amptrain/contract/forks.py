"""A fork: a new job whose first state is another job's checkpoint (``POST /jobs/{id}/fork``).

The child's spec is the parent's with the request's ``overrides`` merged in (objects merge
field by field, anything else replaces) and then validated whole, as a submit is. What may
differ is what the checkpoint's state stays valid under:

- **Overridable** (:data:`OVERRIDABLE`): the optimizer and its schedule, precision, the step
  budget (``max_steps`` must exceed the fork step), evaluation, health, telemetry, checkpoint
  cadence, clipping, the loss scaler, attempts and wall-clock limit, the queue and the
  loader workers. What carries over on the worker: the model's weights, the scheduler's
  position (applied steps; the new schedule's lr at that position), the scaler's state when
  both run fp16, every RNG stream and the data position. The optimizer's state (AdamW's
  moments, SGD's momentum) is kept when the optimizer is of the same kind, with the new
  hyper-parameters set over it; another kind starts with fresh state.
- **Fixed** (:data:`FIXED`, a 422 naming ``overrides.<field>`` and why): the model, the
  dataset, the weights it started from, and what the data position or the checkpoint's
  layout depends on. ``batch_size`` is refused: the data position is ``step x batch_size``
  and a checkpoint keeps its micro-batch split, so another batch would either skip or repeat
  samples; a fork at another batch size is a fresh job from the exported weights.
- Anything else is no spec field: refused as unknown.

``precision``: an explicit one is trained in (the scaler starts fresh when fp16 is new);
``auto`` (also when inherited) is the precision the checkpoint was written in, as for a
resume, so a fork without overrides stays bitwise.

The checkpoint a fork waits for is pinned (:mod:`amptrain.core.checkpoint_pins`). Not
covered, and said so by the fork failing as ``resume_mismatch`` naming the step: a prune
that read the pins just before the API wrote its pin (the pruner reads them right before it
removes), and a parent's retry that goes back before the fork step and discards the later
checkpoints (its lineage rule, which pins do not override).

Torch-free: the API validates with it; the worker only reads the stored lineage.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from amptrain.contract.health_spec import MAX_STEPS, StrictModel
from amptrain.contract.spec import JobSpec, Text

OVERRIDABLE = frozenset(
    {
        "optimizer",
        "schedule",
        "precision",
        "max_steps",
        "max_runtime_s",
        "grad_clip_norm",
        "loss_scale",
        "telemetry",
        "checkpoint",
        "health",
        "eval",
        "max_attempts",
        "queue",
        "loader_workers",
        "deterministic",
        "collective_timeout_s",
    }
)
"""Top-level spec fields a fork may change."""

_SAME_STATE = "the checkpoint's state is only valid for the parent's"
FIXED: dict[str, str] = {
    "model": f"the model cannot change in a fork: {_SAME_STATE} model",
    "dataset": f"the dataset cannot change in a fork: {_SAME_STATE} data and data position",
    "weights": "a fork starts from the parent's checkpoint, never from a weights file",
    "batch_size": "batch_size cannot change in a fork: the data position is step x "
    "batch_size and the checkpoint keeps its micro-batch split (export the weights and "
    "submit a new job instead)",
    "grad_accum_steps": "grad_accum_steps cannot change in a fork: the checkpoint keeps "
    "its micro-batch split",
    "devices": "devices cannot change in a fork: RNG states and data shares are per device",
    "parallelism": "parallelism cannot change in a fork: the model and optimizer are "
    "stored differently",
    "seed": "seed cannot change in a fork: samples are functions of the seed, and the "
    "RNG streams come from the checkpoint",
    "device": "device cannot change in a fork: the checkpoint's RNG streams are per device",
    "auto_micro_batch": "auto_micro_batch cannot change in a fork",
    "activation_checkpointing": "activation_checkpointing cannot change in a fork",
    "name": "give the fork's name as the request's name, not an override",
}
"""Spec fields a fork keeps, each with the reason a 422 gives."""

MAX_OVERRIDE_DEPTH = 4
"""Nesting of ``overrides`` (``health.spike.window`` is 3 deep)."""
MAX_OVERRIDE_BYTES = 16_384
"""``overrides`` as compact JSON; a whole spec's worth of them is far less."""


def _bounded(value: dict[str, Any]) -> dict[str, Any]:
    if _depth(value) > MAX_OVERRIDE_DEPTH:
        raise ValueError(f"nested deeper than {MAX_OVERRIDE_DEPTH} levels")
    size = len(json.dumps(value, separators=(",", ":")))
    if size > MAX_OVERRIDE_BYTES:
        raise ValueError(f"{size} bytes as JSON; at most {MAX_OVERRIDE_BYTES}")
    return value


def _depth(value: Any) -> int:
    # Iterative: the request body is already parsed (the body limit bounds it), but a deep
    # one must not cost a recursion error before it is refused.
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            if level + 1 > MAX_OVERRIDE_DEPTH:
                return level + 1
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class ForkRequest(StrictModel):
    """``POST /jobs/{id}/fork``: start a new job from the parent's checkpoint at ``step``."""

    step: int = Field(ge=0, le=MAX_STEPS, strict=True)
    """The parent's checkpoint to start from (``GET /jobs/{id}/checkpoints`` lists them)."""
    overrides: Annotated[dict[str, Any], AfterValidator(_bounded)] = Field(default_factory=dict)
    """Spec fields to change (see :data:`OVERRIDABLE`); objects merge field by field:
    ``{"optimizer": {"lr": 0.0005}}`` keeps the parent's other optimizer settings."""
    name: Text | None = Field(default=None, min_length=1, max_length=200)
    """The fork's name; default: the parent's with ``@<step>``."""


class ForkRefused(ValueError):
    """The overrides make no valid fork: ``problems`` as pydantic error dicts (``loc``,
    ``msg``, ``type``), each located under ``overrides``."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(str(p["msg"]) for p in problems))
        self.problems = problems


def fork_spec(parent: dict[str, Any], request: ForkRequest) -> JobSpec:
    """The child's spec: ``parent`` (a stored spec) with the overrides merged in, validated
    whole; :class:`ForkRefused` naming each bad field under ``overrides``."""
    problems = [
        {"loc": ("overrides", key), "msg": _refusal(key), "type": "forbidden"}
        for key in request.overrides
        if key not in OVERRIDABLE
    ]
    if parent.get("parallelism") == "fsdp":
        msg = "forks of parallelism fsdp jobs are not supported yet: their checkpoints are sharded"
        problems.append({"loc": (), "msg": msg, "type": "unsupported"})
    if problems:
        raise ForkRefused(problems)
    merged = _merge(parent, request.overrides)
    merged["name"] = request.name or _default_name(str(parent.get("name", "job")), request.step)
    try:
        spec = JobSpec.model_validate(merged)
    except ValidationError as exc:
        raise ForkRefused(
            [
                {"loc": ("overrides", *e["loc"]), "msg": e["msg"], "type": e["type"]}
                for e in exc.errors()
            ]
        ) from None
    if spec.max_steps <= request.step:
        where = ("overrides", "max_steps") if "max_steps" in request.overrides else ("step",)
        msg = (
            f"max_steps ({spec.max_steps}) must exceed the fork step ({request.step}): "
            "the fork trains the steps after it"
        )
        raise ForkRefused([{"loc": where, "msg": msg, "type": "greater_than"}])
    return spec


def _refusal(key: str) -> str:
    if key in FIXED:
        return FIXED[key]
    if key in JobSpec.model_fields:
        return f"{key} cannot change in a fork"
    return "unknown field: not a job spec field that a fork may change"


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _default_name(parent: str, step: int) -> str:
    suffix = f"@{step}"
    return parent[: 200 - len(suffix)] + suffix
