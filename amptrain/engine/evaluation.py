"""Evaluation on the dataset's held-out split (``spec.eval``).

The :class:`Evaluator` reads the held-out split from its start each time (the same samples
at every evaluation, so the series is comparable step to step), in eval mode, without
gradients, under the job's autocast. It touches neither the training data position nor
any global random number generator, so a run with evaluation on trains bitwise like one
with it off, and resumes exactly.

Sums (loss x count, correct, top-5 correct, count, and one per plugin metric a job
chose) stay device tensors and are read once at the end of an evaluation. Metrics that
are no such mean (macro F1, precision, recall, AUROC, the confusion matrix, a plugin's
``torchmetrics.Metric``) are torchmetrics states updated per micro-batch in fp32 and
computed at the end (:mod:`amptrain.engine.eval_library`).

A metric ``eval.metrics`` names that the dataset's task cannot give (``accuracy`` for a
language model, ``top5_accuracy`` with 5 classes or fewer, a plugin's for another task)
is an InvalidSpecError naming ``eval.metrics``, not left out.

With ``devices`` > 1 each rank evaluates its share of the batches and the sums are
all-reduced (torchmetrics gathers its states itself), so every rank has the same values. All ranks evaluate one model: rank 0's
buffers (BatchNorm running statistics, which each rank's forwards update from its own
shard) are broadcast to the others first (one collective), so the values are those of
rank 0's checkpoint evaluated on one device.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from amptrain.components.held_out import held_out_of
from amptrain.components.registry import metric_class, metric_registration
from amptrain.contract import records
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.eval_choice import (
    CONFUSION_MATRIX,
    EVAL_CHOICES,
    EVAL_ON_REQUEST_BY_TASK,
    inapplicable,
    inapplicable_message,
)
from amptrain.contract.metrics import EVAL_METRICS, EVAL_METRICS_BY_TASK, Task
from amptrain.contract.spec import JobSpec
from amptrain.engine.amp_step import AmpStep
from amptrain.engine.distributed import Group
from amptrain.engine.precision import fp32_island

BUILTIN_SUMS = 4
"""The device sums every evaluation keeps (loss x count, correct, top-5 correct, count);
each plugin metric adds one."""
TOP_K = 5
"""``top5_accuracy``: the label among the top this-many classes (only with more classes)."""
_SUMMED = frozenset(("eval_loss", "accuracy", "top5_accuracy", "perplexity", "token_accuracy"))
"""The built-in metrics computed from the device sums (the others by torchmetrics)."""


def task_metrics(task: Task, num_classes: int) -> tuple[str, ...]:
    """The built-in metrics a task gives by default (``top5_accuracy`` only with more than
    5 classes)."""
    names = EVAL_METRICS_BY_TASK[task]
    return tuple(n for n in names if n != "top5_accuracy" or num_classes > TOP_K)


class Evaluator:
    """Measures the model on ``held_out`` (see :mod:`amptrain.components.held_out`)."""

    def __init__(
        self,
        spec: JobSpec,
        model: torch.nn.Module,
        amp: AmpStep,
        held_out: Any,
        device: torch.device,
        group: Group,
        channels_last: bool = False,
    ) -> None:
        self.model = model  # the unwrapped module: no DDP hooks or buffer broadcasts
        self.amp = amp
        self.held_out = held_out
        self.device = device
        self.group = group
        # fsdp: each forward gathers every block's weights with the other ranks, so every rank
        # must run as many (see _sums).
        self.lockstep = spec.parallelism == "fsdp" and group.parallel
        self.channels_last = channels_last
        info = held_out.info
        wanted = spec.eval.metrics
        self.metrics = _builtin_choice(wanted, info.task, info.num_classes)
        self.custom, classes = _plugin_metrics(wanted or [], info.task)
        self.rows = spec.eval.batches * spec.batch_size
        if hasattr(held_out, "__len__"):  # finite: never read past its end
            self.rows = min(self.rows, len(held_out))
        # Read and run in micro-batches: the forward then needs no more memory than the
        # training forward the fit check accounted for, whatever grad_accum_steps is.
        self.chunk = spec.micro_batch_size
        library = [n for n in self.metrics if n not in _SUMMED]
        self.library = None
        if library or classes:
            from amptrain.engine import eval_library as lib  # loads torchmetrics

            lib.check_library_choice(
                [*library, *classes], info.num_classes, self.rows, group.world_size
            )
            chosen = [(n, lib.BUILTIN[n](info.num_classes), True) for n in library]
            chosen += [
                (n, lib.plugin_metric(n, c, info.num_classes), False) for n, c in classes.items()
            ]
            self.library = lib.LibraryMetrics(chosen, device, group)
            # Every rank updates the states at least once (torchmetrics gathers only states
            # of one shape): at least one chunk per rank.
            self.chunk = min(self.chunk, max(1, self.rows // group.world_size))
        plugins = {name for name, _ in self.custom} | set(classes)
        self.names = [
            *(n for n in self.metrics if n != CONFUSION_MATRIX),
            *(n for n in dict.fromkeys(wanted or []) if n in plugins),  # in the spec's order
        ]
        self.chunks = -(-self.rows // self.chunk)  # the last one may be partial
        self.every_steps, self.at_end = spec.eval.every_steps, spec.eval.at_end
        self.last_values: dict[str, float | None] | None = None

    def due(self, step: int, last: int | None, *, final: bool) -> bool:
        """Whether to evaluate after optimizer step ``step`` (``final``: the run's last),
        the latest evaluation having been at step ``last`` (the train state keeps it)."""
        if step == last:
            return False
        if final:
            return self.at_end
        return self.every_steps > 0 and step % self.every_steps == 0

    def run(self, step: int) -> dict[str, float | None]:
        """The metrics of the model as it is after ``step`` (None where not finite)."""
        # Each rank's running statistics are rank 0's plus its own shard's last updates (DDP
        # broadcasts rank 0's buffers at the start of a step's first forward): evaluate all
        # on rank 0's, the checkpoint's. Overwriting the local ones changes no training: the
        # next step's first forward overwrites them with rank 0's anyway, and train-mode
        # BatchNorm normalizes with the batch's statistics, not the running ones.
        self.group.share_leader_buffers(self.model)
        was_training = self.model.training
        self.model.eval()
        if self.library is not None:
            self.library.reset()
        try:
            with _rng_untouched(self.device), torch.no_grad():
                sums = self._sums()
        finally:
            self.model.train(was_training)
            if self.lockstep:
                # The root keeps its weights gathered after a forward for the backward that
                # usually follows: none does here, so shard them again (memory, checkpoints).
                self.model.reshard()  # type: ignore[operator]
        self.group.all_reduce_sum(sums)
        # Collectives in the same order on every rank: the sums, then each library metric.
        library = self.library.compute() if self.library is not None else {}
        loss_sum, correct, top5, count, *custom = sums.tolist()  # the sums' one host read
        loss = loss_sum / count
        values = {
            "eval_loss": loss,
            "accuracy": correct / count,
            "top5_accuracy": top5 / count,
            "token_accuracy": correct / count,
            "perplexity": math.exp(loss) if loss < 700 else math.inf,
            **library,
        }
        values.update(
            {name: total / count for (name, _), total in zip(self.custom, custom, strict=True)}
        )
        result = {n: (values[n] if math.isfinite(values[n]) else None) for n in self.names}
        self.last_values = result
        return result

    def records(self, step: int, values: dict[str, float | None]) -> list[dict[str, Any]]:
        """What the evaluation after ``step`` publishes: its ``eval`` record, then the
        ``confusion_matrix`` event when ``eval.metrics`` asked for one (see
        :data:`~amptrain.contract.eval_choice.CONFUSION_MATRIX`)."""
        done = [records.evaluation(step, time.time(), values)]
        matrix = self.library.take_matrix() if self.library is not None else None
        if matrix is not None:
            done.append(records.event(CONFUSION_MATRIX, step, time.time(), **matrix))
        return done

    def _sums(self) -> torch.Tensor:
        sums = torch.zeros(BUILTIN_SUMS + len(self.custom), dtype=torch.float64, device=self.device)
        # Rank r takes chunks r, r + world, ...: the ranks together cover each row once.
        mine = range(self.group.rank, self.chunks, self.group.world_size)
        if self.lockstep:
            # A rank with a chunk fewer runs one more forward (of chunk 0), thrown away.
            for _ in range(-(-self.chunks // self.group.world_size) - len(mine)):
                with self.amp.autocast():
                    self.model(self._chunk(0)[0])
        for c in mine:
            inputs, targets = self._chunk(c)
            with self.amp.autocast():
                logits = self.model(inputs)
                with fp32_island():
                    loss = self.amp.loss_fn(logits.float(), targets)
            count = targets.numel()  # samples, or tokens for a language model
            sums[0] += loss.double() * count
            sums[1] += (logits.argmax(-1) == targets).sum()
            if "top5_accuracy" in self.metrics:
                top = logits.topk(TOP_K, dim=-1).indices
                sums[2] += (top == targets.unsqueeze(-1)).any(-1).sum()
            sums[3] += count
            for i, (name, compute) in enumerate(self.custom, start=BUILTIN_SUMS):
                sums[i] += _per_sample(name, compute, logits.float(), targets).sum()
            if self.library is not None:
                self.library.update(logits, targets)
        return sums

    def _chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out chunk ``c`` on the device, as training's micro-batches are laid out."""
        start = c * self.chunk
        inputs, targets = self.held_out.batch(start, min(self.chunk, self.rows - start))
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets


def _builtin_choice(wanted: list[str] | None, task: Task, num_classes: int) -> tuple[str, ...]:
    """The built-in metrics to compute, in the table's order: the task's defaults when
    ``wanted`` is None, else those it names (InvalidSpecError for one the task cannot give)."""
    if wanted is None:
        return task_metrics(task, num_classes)
    refused = inapplicable(wanted, task)
    if refused:
        raise InvalidSpecError(f"eval.metrics: {inapplicable_message(refused, task)}")
    if "top5_accuracy" in wanted and num_classes <= TOP_K:
        raise InvalidSpecError(
            f"eval.metrics: top5_accuracy needs more than {TOP_K} classes; the dataset has "
            f"{num_classes}"
        )
    order = [*(m.name for m in EVAL_METRICS), CONFUSION_MATRIX]
    gives = {*EVAL_METRICS_BY_TASK[task], *EVAL_ON_REQUEST_BY_TASK[task]}
    return tuple(n for n in order if n in wanted and n in gives)


def _plugin_metrics(
    names: list[str], task: Task
) -> tuple[list[tuple[str, Callable[..., Any]]], dict[str, type]]:
    """The plugin metrics among ``names``: per-sample functions, and torchmetrics classes,
    by name (InvalidSpecError for one that does not apply to ``task``)."""
    functions, classes = [], {}
    for name in dict.fromkeys(names):  # each once, in the spec's order
        if name in EVAL_CHOICES:
            continue
        reg = metric_registration(name)
        if task not in reg.tasks:
            raise InvalidSpecError(
                f"eval.metrics: plugin metric {name!r} applies to {', '.join(reg.tasks)}, "
                f"not to this dataset's task ({task})"
            )
        cls = metric_class(reg)
        if cls is None:
            functions.append((name, reg.resolve_compute()))
        else:
            classes[name] = cls
    return functions, classes


def _per_sample(
    name: str, compute: Callable[..., Any], logits: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """A plugin metric's per-sample values, as float64 (shapes are host metadata: no sync)."""
    values = compute(logits, targets)
    if not isinstance(values, torch.Tensor) or values.shape != targets.shape:
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise InvalidSpecError(
            f"eval.metrics: metric {name!r} returned {got}; it must return one value per "
            f"sample, a tensor of the targets' shape {tuple(targets.shape)}"
        )
    return values.double()


@contextlib.contextmanager
def _rng_untouched(device: torch.device) -> Iterator[None]:
    """Puts the torch (CPU and this CUDA device), python and numpy generators back as they
    were: a held-out path that draws from them must not shift training's random stream."""
    python, numpy = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def build_evaluator(
    spec: JobSpec,
    dataset: Any,
    model: torch.nn.Module,
    amp: AmpStep,
    device: torch.device,
    group: Group,
    channels_last: bool,
) -> Evaluator | None:
    """The run's evaluator; None when ``eval.enabled`` is false, or null and the dataset
    has no held-out split. InvalidSpecError when it is true and there is none to evaluate on."""
    if spec.eval.enabled is False:
        return None
    held_out = held_out_of(dataset)
    if held_out is None:
        if spec.eval.enabled:
            raise InvalidSpecError(
                f"eval.enabled is true but dataset {spec.dataset.name!r} has no held-out split"
            )
        return None
    return Evaluator(spec, model, amp, held_out, device, group, channels_last)
