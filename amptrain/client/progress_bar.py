"""The progress bar of ``amptrain watch`` and ``amptrain train``: a job's metric fields
(smoothed loss, loss scale, skipped steps, memory, steady-state samples/s) beside the bar
when they all fit there, else whole on the line below it.

At 80 columns the name, bar, step count, elapsed time and ETA leave about 25 characters:
room for two of the five fields the README promises, so the rest went missing. On a
line of their own all five fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.console import RenderableType
from rich.progress import Progress
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
