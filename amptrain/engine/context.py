"""What a caller hands the engine, and what it gets back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from amptrain.contract.records import Sink
from amptrain.engine.cpu_probe import Bf16Probe
from amptrain.engine.distributed import Ranks
from amptrain.engine.precision import PrecisionChoice

StopReason = str  # "cancel" | "preempt"


def _never_stop() -> str | None:
    return None


@dataclass(frozen=True)
class ForkOrigin:
    """Where a fork starts (:mod:`amptrain.contract.forks`): its parent's checkpoint."""

    checkpoint_dir: str
    """The parent's checkpoint directory (local path or fsspec URL): only read."""
    step: int
    """The parent's checkpoint to start from."""
    parent: str
    """The parent job's id (for the event)."""
    fork_id: str
    """This job's id: names its pin beside the parent's checkpoint, released once this run
    holds its own copy."""


@dataclass
class RunContext:
    """Where this run writes, how it is told to stop, and what the worker already measured."""

    checkpoint_dir: str | None
    """Local directory or fsspec URL for THIS job's checkpoints; None disables checkpoints."""
    sink: Sink | None = None
    """Receives batches of telemetry records from a background thread."""
    data_roots: Sequence[str] = ()
    """Directories/URLs under which file-backed datasets may read."""
    weights_roots: Sequence[str] = ()
    """Local directories under which the spec's ``weights.path`` may be read."""
    should_stop: Callable[[], str | None] = _never_stop
    """Polled at every step boundary (keep it cheap): "cancel", "preempt" or None."""
    resume: bool = True
    """Load the newest checkpoint in ``checkpoint_dir`` when there is one."""
    attempt: int = 1
    """Which attempt of its job this run is; every checkpoint records the attempt that
    wrote it (its *lineage*: the attempt whose telemetry covers its steps)."""
    recorded: Mapping[int, int] | None = None
    """Per attempt, the newest step of its telemetry in the job's durable history. The run
    resumes from the newest checkpoint whose writing attempt has recorded through its step,
    and removes the checkpoints after that one (abandoned or unrecorded lineages): it then
    re-records every step after it, so the job's series has no gap. None: the newest
    checkpoint, whatever was recorded (a run outside the service)."""
    cpu_bf16_probe: Bf16Probe | None = None
    """The worker's measurement of bf16 vs fp32 on this CPU, which ``precision: auto``
    uses instead of measuring again (so a worker's jobs all decide alike); None measures."""
    precision_cache: MutableMapping[str, dict[str, Any]] | None = None
    """Where ``precision: auto`` keeps its measured decisions per model, shapes and device
    (the worker: a file that outlives its one-attempt processes); None: this process's dict."""
    ranks: Ranks | None = None
    """This process's place in a data-parallel run (``Ranks.from_env`` under torchrun); None:
    a single process. A stop request on any rank stops every rank at the same flush."""
    fork: ForkOrigin | None = None
    """A fork: with no checkpoint of its own yet, the run starts from its parent's."""
    precision_override: str | None = None
    """After a precision fallback (``health.fallback``): the precision this attempt trains in
    instead of the spec's, decided by the attempt fp16 left (not measured again)."""


@dataclass
class Components:
    """Pre-built parts; tests inject these, ``None`` builds them from the spec via the registry."""

    model: torch.nn.Module
    dataset: Any  # amptrain.components.base.Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TrainResult:
    """How a run that finished normally ended."""

    final_step: int
    resumed_from: int | None
    precision: PrecisionChoice
    skipped_steps: int
    dropped_records: int
    last_record: dict[str, Any] | None
    rank: int = 0
    world_size: int = 1
    eval: dict[str, float | None] | None = None
    """The latest evaluation's values (the end one when ``eval.at_end``); None: none ran."""
    overflow_counts: dict[str, int] = field(default_factory=dict)
    """fp16: per parameter (module path), the skipped steps of this run whose first
    non-finite gradient in backward order was its; most frequent first."""
