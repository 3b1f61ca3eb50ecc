"""The progress bar of ``amptrain watch`` and ``amptrain train``: a job's metric fields
(smoothed loss, loss scale, skipped steps, memory, steady-state samples/s) beside the bar
when they all fit there, else whole on the line below it.

At 80 columns the name, bar, step count, elapsed time and ETA leave about 25 characters:
room for two of the five fields the README promises, so the rest went missing. On a
line of their own all five fit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

BELOW_INDENT = 2
"""The fields' own line starts this far in, under the job's name."""


class StatsProgress(Progress):
    """rich's :class:`~rich.progress.Progress` whose tasks may carry a ``below`` field: a
    line shown under the bars (empty: none)."""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        for task in self.tasks:
            if task.fields.get("below"):
                yield Text(" " * BELOW_INDENT + str(task.fields["below"]), no_wrap=True)


def placed(fields: Callable[[int | None], str], room: int, width: int) -> dict[str, Any]:
    """The ``stats`` (beside the bar, within ``room``) and ``below`` task fields for the
    metric fields ``fields(width)`` gives (None: all of them): beside when all fit there,
    else below, leaving out only what a whole line cannot hold."""
    whole = fields(None)
    if len(whole) <= room:
        return {"stats": whole, "below": ""}
    return {"stats": "", "below": fields(width - BELOW_INDENT)}


class JobElapsedColumn(ProgressColumn):
    """The job's own elapsed time (``H:MM:SS``): since it started (task field ``since``,
    unix seconds; the time it was queued until it starts), to when it finished (``until``)
    or now. rich's own column counts from when the watch began: 0:00:05 for a job that had
    run 40 s."""

    def render(self, task: Task) -> Text:
        since, until = task.fields.get("since"), task.fields.get("until")
        if since is None:
            return Text("-:--:--", style="progress.elapsed")
        seconds = max(0, int((until if until is not None else time.time()) - since))
        return Text(str(timedelta(seconds=seconds)), style="progress.elapsed")


def job_times(job: dict[str, Any]) -> tuple[float | None, float | None]:
    """The ``since`` and ``until`` task fields of ``job`` (as ``GET /jobs/{id}`` has it)."""

    def unix(stamp: str | None) -> float | None:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None

    return unix(job.get("started_at")) or unix(job.get("created_at")), unix(job.get("finished_at"))


NAME_WIDTH = 16
"""A longer job name is cut (with …) so that step/total, elapsed and ETA always fit."""
_TIMES = len(" 0:00:00 eta 0:00:00 ")


def bar_width(width: int) -> int:
    return 10 if width < 100 else 20


def stats_room(width: int, name: str, max_steps: int) -> int:
    """What a line of ``width`` leaves for the metric fields once the columns that must
    stay (name, bar, step/total, elapsed, ETA) have theirs; the fields then drop from
    the end (lowest priority first) until they fit."""
    steps = 2 * len(str(max_steps)) + 1
    return width - len(name) - 1 - bar_width(width) - 1 - steps - _TIMES


def short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def bar(out: Console, disable: bool = False) -> StatsProgress:
    """The bar of one job on ``out``: name, bar, step/total, the job's elapsed time, ETA,
    and its metric fields (``stats`` beside, ``below`` under it: :func:`placed`)."""
    return StatsProgress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(bar_width=bar_width(out.width)),
        MofNCompleteColumn(),
        JobElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[stats]}"),
        console=out,
        disable=disable,
    )
