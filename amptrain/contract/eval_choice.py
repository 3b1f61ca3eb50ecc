"""Which evaluation metrics a job may ask for in ``eval.metrics``, and which its task gives.

The series themselves are defined in :data:`amptrain.contract.metrics.EVAL_METRICS`; this
adds the task rules around them (those computed only on request, the confusion matrix,
which is published as an event, not a series), so the spec's validation, the submit-time
component check and the engine agree. Torch-free and dependency-free.
"""

from __future__ import annotations

from amptrain.contract.metrics import EVAL_METRICS, EVAL_METRICS_BY_TASK, Task

CONFUSION_MATRIX = "confusion_matrix"
"""Not a series: ``eval.metrics`` naming it makes every evaluation of a classifier also
send an event of this type right after its ``eval`` record, at the same step. Its data:
``matrix``, the held-out sample counts as ``classes`` rows (the label) of ``classes``
columns (the top class predicted); ``classes``; ``samples`` (the matrix's total)."""
CONFUSION_MATRIX_MAX_CLASSES = 100
"""The most classes a confusion matrix is published for (an event of 10^4 counts at most);
a job asking for one with more is refused (``eval.metrics``)."""

EVAL_ON_REQUEST_BY_TASK: dict[Task, tuple[str, ...]] = {
    "classification": (
        "f1_macro",
        "precision_macro",
        "recall_macro",
        "auroc_macro",
        CONFUSION_MATRIX,
    ),
    "language_model": (),
}
"""Built-in metrics a task gives only when ``eval.metrics`` names them: each is computed by
``torchmetrics`` and keeps state that grows with the classes (``auroc_macro``: with the
evaluated samples too)."""

EVAL_CHOICES: tuple[str, ...] = (*(m.name for m in EVAL_METRICS), CONFUSION_MATRIX)
"""Every built-in name ``eval.metrics`` may list (installed plugins add theirs)."""


def task_of(kind: str | None) -> Task | None:
    """The task of a catalog data kind (a dataset's ``provides``): ``tokens`` are a language
    model's, every other kind a classifier's; None when the kind is known only once built."""
    if kind is None:
        return None
    return "language_model" if kind == "tokens" else "classification"


def inapplicable(names: list[str] | None, task: Task) -> list[str]:
    """The built-in metrics among ``names`` that ``task`` cannot give (``accuracy`` for a
    language model, ``perplexity`` for a classifier), each once, in the given order."""
    gives = {*EVAL_METRICS_BY_TASK[task], *EVAL_ON_REQUEST_BY_TASK[task]}
    return [n for n in dict.fromkeys(names or ()) if n in EVAL_CHOICES and n not in gives]


def inapplicable_message(names: list[str], task: Task) -> str:
    """Why ``names`` are refused, for ``eval.metrics``' error."""
    gives = [*EVAL_METRICS_BY_TASK[task], *EVAL_ON_REQUEST_BY_TASK[task]]
    kind = "a language model" if task == "language_model" else "a classifier"
    return (
        f"{', '.join(names)}: not computed for {kind}'s data; this dataset's task gives "
        f"{', '.join(gives)}"
    )
