"""The progress bar at an 80-column terminal shows what the README says it does: the
smoothed loss, the loss scale, skipped steps, memory and samples/s (no server needed)."""

from __future__ import annotations

import functools
import io
import re

from rich.console import Console

from amptrain.client.progress_bar import bar, placed, stats_room
from amptrain.contract.progress import ProgressView, progress_line

POINT = {
    "step": 120,
    "loss": 0.5868,
    "loss_scale": 65536.0,
    "skipped_steps": 2,
    "memory_peak": 48 * 2**20,
    "samples_per_second": 29_350.0,
    "step_time_ms": 1.1,
}


def render(width: int) -> list[str]:
    out = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    progress = bar(out)
    task = progress.add_task("fallback-demo", total=300, completed=120, stats="", below="")
    point = ProgressView().add(POINT)
    fields = functools.partial(progress_line, point, smoothed_loss=True)
    room = stats_room(width, "fallback-demo", 300)
    progress.update(task, **placed(fields, room, width))
    out.print(progress.get_renderable())
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.file.getvalue())  # type: ignore[attr-defined]
    return [line for line in text.splitlines() if line.strip()]


def test_at_80_columns_every_field_shows_on_the_line_below_the_bar() -> None:
    lines = render(80)
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines), lines
    assert "120/300" in lines[0]
    for shown in ("smoothed loss 0.5868", "scale 65536", "skipped 2", "mem 48 MiB", "samples/s"):
        assert shown in lines[1], lines


def test_a_wide_terminal_keeps_one_line() -> None:
    (line,) = render(200)
    assert "120/300" in line and "smoothed loss 0.5868" in line and "samples/s" in line
