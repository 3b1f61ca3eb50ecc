"""Events as a person reads them: one short line each, runs of checkpoints as one line.

``logs`` and ``watch`` print these instead of raw JSON (which wrapped at 80 columns and
showed server paths); ``--json`` still gives every event whole.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from amptrain.contract.layers import layer_line
from amptrain.contract.metrics import EVAL_METRICS, show
from amptrain.contract.records import (
    OVERFLOW_WARNING,
    PRECISION_FALLBACK,
    ROLLBACK_EVENT,
    WAITING_FOR_NODES,
    WEIGHTS_EVENT,
)

Event = dict[str, Any]
CHECKPOINTS_SHOWN = 3
"""Steps a collapsed run of checkpoints names at each end."""


def _error(data: dict[str, Any]) -> str:
    nested = data.get("error")
    error: dict[str, Any] = nested if isinstance(nested, dict) else data
    message = str(error.get("message") or error.get("reason") or "")
    code = error.get("code")
    if code and message and not message.startswith(str(code)):  # not "diverged: diverged at"
        return f"{code}: {message}"
    return message or str(code or "")


def _started(data: dict[str, Any]) -> str:
    precision = data.get("precision") or {}
    chosen = precision.get("effective") if isinstance(precision, dict) else None
    parts = [f"attempt {data['attempt']}" if data.get("attempt") else ""]
    parts += [f"on {data['worker']}" if data.get("worker") else ""]
    parts += [f"({chosen})" if chosen else ""]
    return " ".join(p for p in parts if p)


def _precision(data: dict[str, Any]) -> str:
    chosen, reason = data.get("effective"), data.get("reason")
    return f"{chosen}" + (f": {reason}" if reason else "") if chosen else ""


def _micro_batch(data: dict[str, Any]) -> str:
    return f"{data.get('old')} -> {data.get('new')} ({data.get('reason', '')})"


def _resumed(data: dict[str, Any]) -> str:
    return f"from step {data['from_step']}" if data.get("from_step") is not None else ""


def _weights(data: dict[str, Any]) -> str:
    text = f"{data.get('loaded')} tensors from {data.get('path')}"
    if data.get("cast_from"):
        text += f" (cast from {', '.join(map(str, data['cast_from']))})"
    kinds = (("missing", "missing"), ("unexpected", "not in the model"), ("shape", "reshaped"))
    left = [f"{data[f'{k}_count']} {what}" for k, what in kinds if data.get(f"{k}_count")]
    return text + (f"; left out: {', '.join(left)}" if left else "")


_DETAIL: dict[str, Callable[[dict[str, Any]], str]] = {
    "started": _started,
    "resumed": _resumed,
    "precision": _precision,
    "micro_batch": _micro_batch,
    "failed": _error,
    "requeued": _error,
    "cancelled": _error,
    "warning": lambda d: str(d.get("message") or ""),
    PRECISION_FALLBACK: lambda d: f"{d.get('from')} -> {d.get('to')}, {d.get('message', '')}",
    ROLLBACK_EVENT: lambda d: str(d.get("message") or ""),
    WEIGHTS_EVENT: _weights,
    "queued": lambda d: f"on queue {d['queue']}" if d.get("queue") else "",
    WAITING_FOR_NODES: lambda d: str(d.get("message") or ""),
    "checkpoint": lambda d: "",
    "checkpoints": lambda d: str(d.get("message") or ""),
}


def _generic(data: dict[str, Any]) -> str:
    """Scalar details as ``key=value``; nested ones and anything path-like left out."""
    shown = [
        f"{k}={v}"
        for k, v in data.items()
        if isinstance(v, str | int | float | bool) and "path" not in k and "/" not in str(v)
    ]
    return " ".join(shown)


def event_line(ev: Event, width: int | None = None) -> str:
    """``HH:MM:SS type step N detail``, the step said once (a detail's own "step N" or
    "at step N" of the same step left out); within ``width`` the detail wraps onto lines
    indented under the type, never cut (rich markup aside)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.get("time") or time.time()))
    data = ev.get("data") or {}
    step = "" if not ev.get("step") else f" step {ev['step']}"
    detail = _once(_DETAIL.get(ev["type"], _generic)(data), ev.get("step"))
    head = f"[dim]{stamp}[/] [cyan]{ev['type']}[/]{step}"
    if not detail:
        return head
    if width is None:
        return f"{head} {_escape(detail)}"
    plain = f"{stamp} {ev['type']}{step} "
    lines = textwrap.wrap(
        detail,
        max(width, len(plain) + MIN_DETAIL),
        initial_indent=" " * len(plain),
        subsequent_indent=" " * CONTINUATION_INDENT,
        break_on_hyphens=False,
    )
    first, *rest = lines or [""]
    return "\n".join([f"{head} {_escape(first.lstrip())}", *map(_escape, rest)])


CONTINUATION_INDENT = 9
"""A wrapped event's continuation lines start under its type (after ``HH:MM:SS ``)."""
MIN_DETAIL = 20
"""Room a detail keeps on the first line however narrow the terminal."""


def _once(detail: str, step: Any) -> str:
    """``detail`` without the event's own step again: "step 3 skipped ..." -> "skipped ...",
    "unhealthy at step 3: ..." -> "unhealthy: ..." (another step's number stays)."""
    if not step:
        return detail
    detail = re.sub(rf"^step {int(step)}\b[:,]?\s*", "", detail)
    return re.sub(rf" at step {int(step)}\b", "", detail)


def eval_names(values: dict[str, Any]) -> list[str]:
    """The order an evaluation's values are shown in: the built-in metrics where higher is
    better (the accuracies) first, then the other built-in ones, then a plugin's by name."""
    known = [m.name for m in EVAL_METRICS if m.better == "higher"]
    known += [m.name for m in EVAL_METRICS if m.better != "higher"]
    return [n for n in known if n in values] + sorted(set(values) - set(known))


def eval_line(data: dict[str, Any], width: int | None = None) -> str:
    """``eval step N · acc 0.93 · eval loss 0.21``: the last values are left out until the
    line fits ``width`` (the first always stays)."""
    values = data.get("values") or {}
    parts = [f"eval step {data.get('step')}", *(show(n, values[n]) for n in eval_names(values))]
    while width is not None and len(parts) > 2 and len(" · ".join(parts)) > width:
        parts.pop()
    return _escape(" · ".join(parts))


def layer_norms_line(data: dict[str, Any], width: int | None = None) -> str:
    """A ``layer_grad_norm`` message as one line within ``width`` (its extremes: see
    :func:`~amptrain.contract.layers.layer_line`)."""
    return _escape(layer_line(data.get("step") or 0, data.get("values") or {}, width))


def eval_headline(values: dict[str, Any]) -> str | None:
    """The one evaluation value a progress line keeps in view (accuracy, else the first
    shown): ``"acc 0.93"``; None when the evaluation holds no value."""
    shown = [n for n in eval_names(values) if values[n] is not None]
    return show(shown[0], values[shown[0]]) if shown else None


def with_headline(stats: Callable[[int], str], headline: str | None, room: int) -> str:
    """A progress line's metric fields (``stats(width)``) with the newest evaluation's
    headline at the end, if both fit ``room``: the step fields give way first."""
    tail = f" · {_escape(headline)}" if headline else ""
    if not tail or room - len(tail) < MIN_STATS:
        return stats(room)
    return stats(room - len(tail)) + tail


MIN_STATS = 12
"""Room the step fields keep before the evaluation headline is left out."""


def collapsed(events: Iterable[Event]) -> Iterator[Event]:
    """``events`` with each run of consecutive checkpoints as one ``checkpoints`` event
    (its ``data.steps`` the run's steps), and each run of consecutive skipped-step warnings
    (fp16 overflows) as one warning: 130 checkpoint lines, or 30 "step N skipped" lines,
    said nothing 3 would not."""
    run: list[Event] = []
    for ev in events:
        if run and _run_kind(ev) != _run_kind(run[0]):
            yield from _flush(run)
            run = []
        if _run_kind(ev) is not None:
            run.append(ev)
        else:
            yield ev
    yield from _flush(run)


def _run_kind(ev: Event) -> str | None:
    if ev["type"] == "checkpoint":
        return "checkpoint"
    if ev["type"] == "warning" and (ev.get("data") or {}).get("code") == OVERFLOW_WARNING:
        return OVERFLOW_WARNING
    return None


def _named(steps: list[Any]) -> str:
    if len(steps) > 2 * CHECKPOINTS_SHOWN:
        steps = [*steps[:CHECKPOINTS_SHOWN], "…", *steps[-CHECKPOINTS_SHOWN:]]
    return ", ".join(map(str, steps))


def _flush(run: list[Event]) -> Iterator[Event]:
    if len(run) <= 1:
        yield from run
        return
    steps = [ev["step"] for ev in run]
    if _run_kind(run[0]) == OVERFLOW_WARNING:
        first = run[0].get("data") or {}
        text = f"{len(run)} steps skipped for inf/NaN gradients (steps {_named(steps)})"
        if first.get("param"):
            text += f"; the first non-finite gradient: {first['param']} ({first.get('norm')})"
        yield {**run[0], "step": None, "data": {"message": text}}
        return
    text = f"{len(run)} checkpoints at steps {_named(steps)}"
    yield {**run[-1], "type": "checkpoints", "step": None, "data": {"message": text}}


def _escape(text: str) -> str:
    """Rich markup is ours: a ``[`` in a message (a user's job name) stays literal."""
    return text.replace("[", "\\[")
