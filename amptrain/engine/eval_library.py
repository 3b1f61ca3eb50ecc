"""Evaluation metrics computed by ``torchmetrics``: the ones that are not a mean of a
per-sample value (macro F1, precision, recall, AUROC, a confusion matrix), built in or a
plugin's ``torchmetrics.Metric`` class.

Each metric keeps its state on the evaluation device, is updated once per held-out
micro-batch with fp32 inputs (under an fp32 island, whatever the job's autocast), is
reset at the start of every evaluation, and is computed once at its end. With
``devices`` > 1, ``compute()`` all-gathers every rank's state over the process group the
engine's :class:`~amptrain.engine.distributed.Group` runs its collectives on (the default
group: ``Group.start`` creates it, or joins the one its caller made) before reducing it,
so macro F1 is that of all the ranks' samples together, not a mean of per-rank values.
It syncs only when the run is data-parallel, even in a process that has a default group
for another reason. torchmetrics draws no random numbers.

Imported only when a job asks for one of these metrics (torchmetrics loads in about a
second).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.classification import (
    MulticlassAUROC,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.eval_choice import CONFUSION_MATRIX, CONFUSION_MATRIX_MAX_CLASSES
from amptrain.engine.distributed import Group
from amptrain.engine.precision import fp32_island

# validate_args=False: the checks read values on the host (a sync per micro-batch); the
# loss computed on the same targets already refuses a label out of range.
BUILTIN: dict[str, Callable[[int], Metric]] = {
    "f1_macro": lambda c: MulticlassF1Score(c, average="macro", validate_args=False),
    "precision_macro": lambda c: MulticlassPrecision(c, average="macro", validate_args=False),
    "recall_macro": lambda c: MulticlassRecall(c, average="macro", validate_args=False),
    # thresholds=None: exact (the area sklearn computes), keeping every sample's scores.
    "auroc_macro": lambda c: MulticlassAUROC(
        c, average="macro", thresholds=None, validate_args=False
    ),
    CONFUSION_MATRIX: lambda c: MulticlassConfusionMatrix(c, validate_args=False),
}
"""The built-in torchmetrics metrics by name, built for a number of classes."""

AUROC_MAX_SCORES = 2**25
"""``auroc_macro`` keeps rows x classes fp32 scores per evaluation (128 MiB at most)."""


@dataclass
class _Entry:
    name: str
    metric: Metric
    probabilities: bool
    """Built-in: updated with softmax probabilities; a plugin's gets the fp32 logits."""


def plugin_metric(name: str, cls: type[Metric], num_classes: int) -> Metric:
    """An instance of a plugin's torchmetrics class: given ``num_classes`` (the dataset's
    classes, or vocabulary) when its constructor takes it, else built with no arguments."""
    try:
        params = inspect.signature(cls).parameters
        metric = cls(num_classes=num_classes) if "num_classes" in params else cls()
    except Exception as exc:  # a plugin's constructor is reported, not crashed on
        raise InvalidSpecError(
            f"eval.metrics: metric {name!r} ({cls.__name__}) could not be built: {exc!r}"
        ) from exc
    return metric


class LibraryMetrics:
    """The torchmetrics metrics of one evaluator, in the order they are reported."""

    def __init__(
        self,
        chosen: list[tuple[str, Metric, bool]],
        device: torch.device,
        group: Group,
    ) -> None:
        self.group = group
        self.entries = [_Entry(n, m.to(device), p) for n, m, p in chosen]
        for entry in self.entries:
            m = entry.metric
            # Synced in compute() only: no collective per micro-batch (each rank updates a
            # different number of times), over the engine's own group, only when parallel.
            m.dist_sync_on_step = False
            m.process_group = dist.group.WORLD if group.parallel else None
            m.distributed_available_fn = self._parallel
        self.matrix: list[list[int]] | None = None

    def _parallel(self) -> bool:
        return self.group.parallel

    @property
    def names(self) -> list[str]:
        """The series names (the confusion matrix is not one)."""
        return [e.name for e in self.entries if e.name != CONFUSION_MATRIX]

    def reset(self) -> None:
        """Forget the previous evaluation's state (and the memory it held)."""
        for entry in self.entries:
            entry.metric.reset()

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """One micro-batch: every metric's state updated in fp32, outside autocast."""
        with fp32_island():
            x = logits.float()
            probs = x.softmax(-1) if any(e.probabilities for e in self.entries) else x
            for entry in self.entries:
                entry.metric.update(probs if entry.probabilities else x, targets)

    def compute(self) -> dict[str, float]:
        """Every metric over all ranks' samples (a collective per metric when parallel; the
        same order on every rank), read to the host at once; the states are then reset."""
        found: list[torch.Tensor] = []
        for entry in self.entries:
            value = entry.metric.compute()
            if entry.name == CONFUSION_MATRIX:
                self.matrix = value.tolist()
                continue
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise InvalidSpecError(
                    f"eval.metrics: metric {entry.name!r} computed {got}; a torchmetrics "
                    "metric must compute one value"
                )
            found.append(value.detach().reshape(()).double())
        self.reset()
        read = torch.stack(found).tolist() if found else []
        return dict(zip(self.names, read, strict=True))

    def take_matrix(self) -> dict[str, Any] | None:
        """The confusion matrix of the last evaluation as an event's data (once), or None."""
        matrix, self.matrix = self.matrix, None
        if matrix is None:
            return None
        return {
            "matrix": matrix,
            "classes": len(matrix),
            "samples": sum(map(sum, matrix)),
        }


def check_library_choice(names: list[str], num_classes: int, rows: int, world: int) -> None:
    """Refuse what these metrics cannot do for this held-out split (naming
    ``eval.metrics``): a confusion matrix of more than
    :data:`~amptrain.contract.eval_choice.CONFUSION_MATRIX_MAX_CLASSES` classes, an exact
    AUROC over more than :data:`AUROC_MAX_SCORES` scores, and fewer evaluated rows than
    devices (each rank must update its state before the state is gathered)."""
    if CONFUSION_MATRIX in names and num_classes > CONFUSION_MATRIX_MAX_CLASSES:
        raise InvalidSpecError(
            f"eval.metrics: confusion_matrix is published for at most "
            f"{CONFUSION_MATRIX_MAX_CLASSES} classes; this dataset has {num_classes}"
        )
    if "auroc_macro" in names and rows * num_classes > AUROC_MAX_SCORES:
        raise InvalidSpecError(
            f"eval.metrics: auroc_macro keeps every evaluated sample's class scores: "
            f"{rows} rows x {num_classes} classes is more than {AUROC_MAX_SCORES}; "
            f"lower eval.batches"
        )
    if rows < world:
        raise InvalidSpecError(
            f"eval.metrics: {', '.join(names)} need at least one held-out row per device; "
            f"the split has {rows} for {world} devices"
        )
