"""Weights a job starts from (``spec.weights``), and the weights a checkpoint exports.

Safetensors only, parsed by the ``safetensors`` library from bytes read through a
descriptor opened beneath a weights root (:func:`~amptrain.components.array_files.
open_data_file`: no symlink, a regular file): nothing in the file can run code, unlike a
pickle, which ``torch.load`` would have to trust. The header's length is checked before
the file is read, so a pickle or a ``torch.save`` zip renamed ``.safetensors`` is refused
by its first eight bytes.

Names and shapes are the model's own ``state_dict()``'s, which for every catalog model are
its library's (a transformers model is the library's module itself, see
:mod:`amptrain.components.hf_models`): what the library's own files use. The same names
go out in the ``.safetensors`` file written beside each checkpoint, so one job's result
starts the next.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import safetensors
import safetensors.torch
import torch

from amptrain.components.array_files import PATH_CHARS, open_data_file
from amptrain.contract.data_access import PathRefused
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.layout import checkpoint_name
from amptrain.contract.records import FORK_EVENT, WEIGHTS_EVENT
from amptrain.contract.spec import WeightsSpec
from amptrain.contract.text import control_character, quote
from amptrain.contract.weights import FIELD, MAX_HEADER_BYTES, MAX_WEIGHTS_BYTES, locate_weights
from amptrain.engine.checkpoint_manager import CheckpointManager, RunState
from amptrain.engine.context import ForkOrigin, RunContext
from amptrain.engine.forks import release_pin, start_from_parent
from amptrain.engine.guardian import Verdict

LISTED = 20
"""Names an event lists of each kind left out (the counts are always whole)."""


def export_bytes(model: torch.nn.Module, state: Mapping[str, Any] | None = None) -> bytes:
    """The model's weights (parameters and buffers) as a safetensors file, library names,
    on the CPU. Copies: tied weights share storage, which safetensors refuses to write.
    ``state``: the model's whole state dict when ``model.state_dict()`` is not it (a sharded
    model's, gathered)."""
    state = model.state_dict() if state is None else state
    tensors = {
        name: t.detach().to("cpu", copy=True).contiguous()
        for name, t in state.items()
        if isinstance(t, torch.Tensor)
    }
    return safetensors.torch.save(tensors)


@dataclass(frozen=True)
class Start:
    """Where a run begins, as the event that says so: its own newest checkpoint
    (``resumed``), the weights its spec names (``weights``), or neither (``event`` None)."""

    event: str | None = None
    step: int = 0
    data: Mapping[str, Any] = field(default_factory=dict)
    fork: ForkOrigin | None = None
    """A fork's origin, whose pin :meth:`kept` releases."""

    @property
    def checkpoint_now(self) -> bool:
        """Weights are checkpointed at once (step 0), so a later attempt resumes from the
        job's own copy, never reading the file again (an operator may replace it meanwhile);
        a fork's first state too (its parent may prune it once released)."""
        return self.event in (WEIGHTS_EVENT, FORK_EVENT)

    def kept(self, verdict: Verdict, checkpoints: CheckpointManager, leader: bool) -> Verdict:
        """After the checkpoint :attr:`checkpoint_now` asked for (``verdict``: its flush's):
        once a fork holds its own copy of its first state, its parent may prune its own."""
        if self.fork is not None and leader and checkpoints.last_saved == self.step:
            release_pin(self.fork)
        return verdict


def begin(
    checkpoints: CheckpointManager,
    run: RunState,
    ctx: RunContext,
    model: torch.nn.Module,
    weights: WeightsSpec | None,
) -> Start:
    """Resume ``run`` from its newest checkpoint (see ``RunContext.resume``), else (a fork)
    from its parent's, else load the weights the spec names into ``model``, else start as
    built."""
    step = checkpoints.resume(run, ctx.recorded) if ctx.resume else None
    if step is not None:
        return Start("resumed", step, {"from_step": step, "name": checkpoint_name(step)})
    if ctx.fork is not None:
        return Start(FORK_EVENT, ctx.fork.step, start_from_parent(run, ctx.fork), ctx.fork)
    if weights is None:
        return Start()
    data = load_initial_weights(model, weights, ctx.weights_roots)
    return Start(WEIGHTS_EVENT, run.train.step, data)


def load_initial_weights(
    model: torch.nn.Module, spec: WeightsSpec, roots: Sequence[str]
) -> dict[str, Any]:
    """Load ``spec.path`` into ``model``; the ``weights`` event's data. ``InvalidSpecError``
    naming ``weights.path`` for a file that may not be read or is not safetensors, and with
    ``strict`` for the first tensor that differs; nothing is loaded then."""
    tensors = read_safetensors(spec.path, roots)
    expected = model.state_dict()
    plan = _Plan(tensors, expected)
    if spec.strict and plan.first_difference:
        raise InvalidSpecError(
            f"{FIELD} {quote(spec.path, PATH_CHARS)}: {plan.first_difference} "
            "(weights.strict false loads what matches)"
        )
    chosen: dict[str, Any] = {
        name: tensors[name].to(expected[name].dtype)  # the model's dtype (fp32 parameters)
        for name in plan.matching
    }
    if any(hasattr(p, "full_tensor") for p in model.parameters()):
        # Sharded (fsdp): every rank read the whole file and keeps its own shards.
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, chosen, options=options)
    else:
        with torch.no_grad():
            model.load_state_dict(chosen, strict=False)
    data: dict[str, Any] = {"path": spec.path, "loaded": len(chosen), "strict": spec.strict}
    cast = sorted(
        {_dtype(tensors[n]) for n in plan.matching if tensors[n].dtype != expected[n].dtype}
    )
    if cast:
        data["cast_from"] = cast
    data.update(plan.left_out())
    return data


def read_safetensors(path: str, roots: Sequence[str]) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path`` under ``roots`` (on the CPU)."""
    try:
        candidates = locate_weights(path, roots)
    except PathRefused as exc:
        raise InvalidSpecError(f"{FIELD}: {quote(path, PATH_CHARS)}: {exc}") from None
    with open_data_file(FIELD, path, candidates, "weights roots") as opened:
        size = opened.size or 0
        if size > MAX_WEIGHTS_BYTES:
            raise opened.refuse(f"larger than the {MAX_WEIGHTS_BYTES >> 30} GiB a file may be")
        head = opened.file.read(8)
        (length,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
        if not 2 <= length <= min(MAX_HEADER_BYTES, size - 8):
            raise opened.refuse(_not_safetensors("its first 8 bytes are no header length"))
        opened.require(size, "the weights file, read once")
        data = head + opened.file.read(size - 8)
    if data[8:9] != b"{" or len(data) != size:
        raise InvalidSpecError(
            f"{FIELD}: {quote(path, PATH_CHARS)}: {_not_safetensors('no JSON header')}"
        )
    try:
        return safetensors.torch.load(data)
    except (safetensors.SafetensorError, ValueError, TypeError) as exc:
        raise InvalidSpecError(
            f"{FIELD}: {quote(path, PATH_CHARS)}: {_not_safetensors(quote(str(exc), 200))}"
        ) from None


def _not_safetensors(why: str) -> str:
    return f"not a safetensors file ({why}); pickles and torch.save files are never read"


class _Plan:
    """Which of the file's tensors fit the model, and what does not, in the model's order."""

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
    ) -> None:
        self.matching: list[str] = []
        self.missing: list[str] = []
        self.shape: dict[str, list[list[int]]] = {}
        self.first_difference: str | None = None
        for name, want in expected.items():
            have = tensors.get(name)
            if have is None:
                self.missing.append(name)
                self._first(f"{_shown(name)} of the model is not in the file")
            elif tuple(have.shape) != tuple(want.shape):
                self.shape[name] = [list(have.shape), list(want.shape)]
                self._first(
                    f"shape of {_shown(name)} is {tuple(have.shape)} in the file, "
                    f"{tuple(want.shape)} in the model"
                )
            else:
                self.matching.append(name)
        self.unexpected = [n for n in tensors if n not in expected]
        if self.unexpected:
            self._first(f"{_shown(self.unexpected[0])} of the file is not in the model")

    def _first(self, text: str) -> None:
        if self.first_difference is None:
            self.first_difference = text

    def left_out(self) -> dict[str, Any]:
        """What the ``weights`` event says was not loaded (empty when everything was)."""
        out: dict[str, Any] = {}
        for key, names in (("missing", self.missing), ("unexpected", self.unexpected)):
            if names:
                out[key] = [_shown(n) for n in names[:LISTED]]
                out[f"{key}_count"] = len(names)
        if self.shape:
            out["shape"] = {_shown(n): s for n, s in list(self.shape.items())[:LISTED]}
            out["shape_count"] = len(self.shape)
        return out


def _shown(name: str) -> str:
    """A tensor name as messages show it: the file's names are the uploader's text."""
    return name if len(name) <= 200 and control_character(name) is None else quote(name, 80)


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
