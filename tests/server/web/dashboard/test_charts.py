"""The job page's charts in a real headless Chromium against the real stack: y axes a
person can read (every label whole, inside its chart, beside the plot, and no two alike,
on linear, log and log2 axes), a diverged run's grad norm drawn up to where it stopped
being finite and marked there, the marks list naming the steps in view when zoomed, and
smoothing that reads one point per bucket of a downsampled run and says so."""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.ab_runs import spec
from tests.server.web.dashboard.conftest import WIDE, screenshot, sign_in
from tests.support.history_data import seed_url
from tests.support.producer import Producer
from tests.support.specs import service_job
from tests.support.stack import Stack

STEPS = 30_000
MIB = 1024 * 1024
SHOTS = os.environ.get("AMPTRAIN_SHOTS_DIR")
"""Where to copy the screenshots too (the before/after notes), when set."""

# Every y label of a chart: its text and box, the chart's box and the plot area's.
Y_LABELS_JS = """(selector) => {
  const chart = document.querySelector(selector);
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {
    chart: box(chart), plot: box(chart.querySelector('.u-over')),
    labels: [...chart.querySelectorAll('.y-labels span')].map((s) => ({text: s.textContent, box: box(s)})),
  };
}"""


def noise(i: int) -> float:
    """Deterministic noise in [-1, 1)."""
    return (math.sin(i * 12.9898) * 43758.5453) % 1.0 * 2 - 1


def shot(page: Page, name: str, tmp_path: Path) -> None:
    """The whole page (every chart), in the kept screenshots folder and, when set, SHOTS."""
    target = screenshot(page, name, tmp_path)
    page.screenshot(path=str(target), full_page=True)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(SHOTS) / target.name)


def saved_run(stack: Stack, name: str, n: int, point: Any) -> str:
    """A finished job whose ``n`` recorded points (``point(i)`` -> loss, loss_scale,
    skipped, grad_norm, lr, memory) go straight into the SQLite file (the test's data, not
    the code under test), as the recorder writes them."""
    job = stack.submit(spec(name=name, max_steps=n))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start()
        t0 = time.time() - n / 100
        rows = [
            (job["id"], 1, 1_700_000_000_000 + i, 0, i, t0 + i / 100, *point(i), 1000.0)
            for i in range(1, n + 1)
        ]
        path = stack.env["AMPTRAIN_DATABASE_URL"].removeprefix("sqlite:///")
        seed_url(stack.env["AMPTRAIN_DATABASE_URL"], rows)
        with sqlite3.connect(path, timeout=30) as db:
            db.execute("UPDATE jobs SET step = ? WHERE id = ?", (n, job["id"]))
        feed.finish("succeeded", n)
    finally:
        feed.close()
    return str(job["id"])


def noisy_point(i: int) -> tuple[Any, ...]:
    """A noisy loss, an fp16 scale halving from 2^16 to 2^4, a flat learning rate of 1e8
    (the ticks of a flat line once all read "1.00e+8"), memory about 334 MiB."""
    loss = 2.0 / math.sqrt(i) + 0.3 * noise(i) + 0.35
    scale = 2.0 ** (16 - (12 * i) // STEPS)
    memory = int(334 * MIB + 2 * MIB * noise(i + 7))
    return (loss, scale, False, 1.0 + 0.5 * noise(i + 3), 1e8, memory, memory + MIB, 340 * MIB)


def open_job(page: Page, stack: Stack, job_id: str) -> None:
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job_id}")
    expect(page.locator("#charts")).to_have_attribute("data-ready", "1")


def assert_readable_y_axis(page: Page, key: str, selector: str = "") -> list[str]:
    """The y labels of chart ``key`` (or the chart at ``selector``): at least two, none
    alike, each whole inside the chart, left of the plot area (itself inside the chart),
    none overlapping the next."""
    seen = page.evaluate(Y_LABELS_JS, selector or f"[data-chart={key}]")
    texts = [label["text"] for label in seen["labels"]]
    assert len(texts) >= 2, (key, texts)
    assert len(set(texts)) == len(texts), (key, texts)
    cl, ct, cr, cb = seen["chart"]
    pl, pr = seen["plot"][0], seen["plot"][2]
    assert pr <= cr, (key, "the plot spills out of its chart", seen)
    for label in seen["labels"]:
        left, top, right, bottom = label["box"]
        assert cl <= left and right <= pl and ct <= top and bottom <= cb, (key, label, seen)
    boxes = sorted((label["box"] for label in seen["labels"]), key=lambda b: b[1])
    for upper, lower in itertools.pairwise(boxes):
        assert upper[3] <= lower[1], (key, texts, boxes)
    return texts


def test_y_axes_read_whole_and_never_repeat_a_label(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    job_id = saved_run(stack, "axes", STEPS, noisy_point)
    open_job(page, stack, job_id)
    shot(page, "charts-axes", tmp_path)
    charts = ["loss", "loss_scale", "grad_norm", "lr", "memory", "throughput"]
    read = {key: assert_readable_y_axis(page, key) for key in charts}
    # About 334 MiB reads so, whole (clipped, it read "33.8 MiB").
    assert all(t.endswith(" MiB") for t in read["memory"]), read["memory"]
    assert max(float(t.split()[0]) for t in read["memory"]) >= 330, read["memory"]
    # The loss scale's base-2 axis: exact powers, spread out.
    assert all(t.startswith("2^") for t in read["loss_scale"]), read["loss_scale"]
    assert "2^16" in read["loss_scale"], read["loss_scale"]  # where fp16 starts is named
    for key in ("loss", "grad_norm", "lr"):
        page.locator(f"[data-chart={key}] header input[type=checkbox]").check()
    expect(page.locator("[data-chart=lr] .y-labels span").first).to_be_visible()
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-chart] .y-labels')].every(l => l.children.length >= 2)"
    )
    for key in charts:
        assert_readable_y_axis(page, key)
    shot(page, "charts-axes-log", tmp_path)


# Legend values of chart ``key`` with the cursor at each fraction of its plot's width.
LEGEND_AT_JS = """async ([key, fractions]) => {
  const chart = document.querySelector(`[data-chart=${key}]`);
  const over = chart.querySelector('.u-over');
  const r = over.getBoundingClientRect();
  const out = [];
  for (const f of fractions) {
    over.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + f * r.width, clientY: r.top + r.height / 2, bubbles: true}));
    await new Promise((frame) => requestAnimationFrame(frame));
    out.push([...chart.querySelectorAll('.u-legend .u-series .u-value')].map((v) => v.textContent));
  }
  return out;
}"""

# Pixels of the plot area drawn in a series' blue (#2f6fde, faint or not), in chart ``key``.
BLUE_PIXELS_JS = """(key) => {
  const chart = document.querySelector(`[data-chart=${key}]`);
  const canvas = chart.querySelector('canvas');
  const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i + 3] > 0 && px[i + 2] - px[i] > 60) n++;
  return n;
}"""


def test_smoothing_reads_one_point_per_bucket_and_says_so(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """Smoothed over every kept point, the buckets' minima and maxima kept the line as
    ragged as the raw one: it reads each bucket's last point now."""
    job_id = saved_run(stack, "smooth", STEPS, noisy_point)
    sign_in(page, stack.token)
    with page.expect_response(lambda r: "max_points=" in r.url and "/metrics" in r.url) as history:
        page.goto(f"/ui/#/jobs/{job_id}")
    expect(page.locator("#charts")).to_have_attribute("data-ready", "1")
    shot(page, "charts-smoothing", tmp_path)
    seen = page.evaluate(LEGEND_AT_JS, ["grad_norm", [0.3 + i / 500 for i in range(100)]])
    raw = [float(v[1]) for v in seen]
    smoothed = [float(v[2]) for v in seen]
    ragged = sum(abs(b - a) for a, b in itertools.pairwise(raw))
    wavy = sum(abs(b - a) for a, b in itertools.pairwise(smoothed))
    print(f"\nsmoothed/raw step-to-step change across 20% of the chart: {wavy / ragged:.3f}")
    assert wavy < 0.15 * ragged  # measured: 0.28 over every kept point, 0.10 over bucket ends
    note = page.locator("[data-chart=grad_norm] .smooth-note")
    expect(note).to_have_text(re.compile(r"^smoothed over 1 point per \d+ steps$"))
    window = history.value.json()["items"]
    ends = [p["step"] for p in window if p["bucket_last"]]
    every = int((note.text_content() or "").split()[5])
    assert every == sorted(b - a for a, b in itertools.pairwise(ends))[len(ends) // 2]
    assert note.get_attribute("title"), "the note says why"


def test_a_diverged_runs_grad_norm_is_drawn_and_marked(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """A real run on the worker that diverges at once: one finite grad norm, then NaN."""
    run = service_job(max_steps=50, grad_clip_norm=None, telemetry={"flush_every_steps": 4})
    run["optimizer"] = {"name": "sgd", "lr": 1e12}
    job = stack.submit(run)
    done = stack.wait_for_status(job["id"], "failed", "succeeded", timeout=120)
    assert done["error"]["code"] == "diverged"
    history = stack.all_metrics(job["id"])
    finite = [p["step"] for p in history if p["grad_norm"] is not None]
    assert finite and len(finite) < len(history)
    open_job(page, stack, job["id"])
    chart = page.locator("[data-chart=grad_norm]")
    expect(chart).to_have_attribute("data-points", str(len(history)))
    shot(page, "charts-diverged", tmp_path)
    bad = len(history) - len(finite)
    expect(chart).to_have_attribute("data-non-finite", str(bad))
    expect(page.locator("[data-marks-for=grad_norm]")).to_contain_text(
        f"{bad} non-finite grad norm step{'s' if bad > 1 else ''} from step {finite[-1] + 1}"
    )
    assert page.evaluate(BLUE_PIXELS_JS, "grad_norm") > 20  # the finite part is drawn


def test_the_marks_list_names_the_steps_in_view(page: Page, stack: Stack, tmp_path: Path) -> None:
    """Forty skipped steps (every tenth); zoomed near the end, the list names those."""
    n = 400

    def point(i: int) -> tuple[Any, ...]:
        return (1.0 / math.sqrt(i), 65536.0, i % 10 == 0, 1.0, 1e-3, MIB, MIB, MIB)

    open_job(page, stack, saved_run(stack, "marks", n, point))
    marks = page.locator("[data-marks-for=loss_scale]")
    expect(marks).to_contain_text("40 skipped steps (step 10, 20, 30, 40, 50, …)")
    box = page.locator("[data-chart=loss] .u-over").bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.7, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.9, y, steps=4)
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('[data-chart=loss] .u-select').offsetWidth === 0"
    )
    shot(page, "charts-marks-zoomed", tmp_path)
    expect(marks).to_contain_text(re.compile(r"40 skipped steps \(\d+ in view: step 2[89]0, "))
    listed = [int(s) for s in (marks.get_attribute("data-listed") or "").split(",")]
    assert listed and all(270 <= s <= 370 for s in listed), listed
    page.dblclick("[data-chart=loss] .u-over")
    expect(marks).to_contain_text("40 skipped steps (step 10, 20, 30, 40, 50, …)")


def test_the_timeline_filters_collapses_dates_and_marks_the_charts(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """Thirty checkpoints read as one line; a filter per event type; each line dated; the
    warning and the micro-batch change marked on the charts at their steps."""
    job = stack.submit(spec(name="events", max_steps=400))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start()
        feed.steps(1, 320)
        feed.evals(100, 200, 300)  # accuracy 0.99, 0.995, 0.9967: ticks 0.0005 apart
        feed.engine_event("micro_batch", 5, micro_batch=8, memory=64 * MIB)
        for step in range(10, 301, 10):
            feed.engine_event("checkpoint", step, name=f"step-{step:08d}.pt")
        feed.engine_event("warning", 305, code="loss_spike", message="loss spiked at step 305")
        assert feed.sink is not None and feed.sink.flush()
        feed.finish("succeeded", 320)
    finally:
        feed.close()
    open_job(page, stack, job["id"])
    expect(page.locator("#timeline [data-type=succeeded]")).to_be_visible()
    shot(page, "charts-events", tmp_path)
    checkpoints = page.locator("#timeline [data-type=checkpoint]")
    expect(checkpoints).to_have_count(1)
    expect(checkpoints).to_have_attribute("data-count", "30")
    expect(checkpoints).to_contain_text("30 checkpoints saved, steps 10\N{EN DASH}300")
    # Dated: the events' day as this browser writes it, on every line.
    day = page.evaluate(
        "(t) => new Date(t * 1000).toLocaleString([], {month: 'short', day: 'numeric'})",
        stack.events(job["id"])[-1]["time"],
    )
    for when in page.locator("#timeline li .t").all_text_contents():
        assert day in when, (day, when)
    # Marked on every chart drawn (this run records a loss and a learning rate; the other
    # charts are one-line notes) at their steps, with what happened.
    loss = page.locator("[data-chart=loss]")
    warning = loss.locator(".event-mark[data-type=warning][data-step='305'] i")
    expect(warning).to_have_attribute("title", re.compile("step 305: Warning at step 305"))
    expect(loss.locator(".event-mark[data-type=micro_batch][data-step='5']")).to_have_count(1)
    expect(page.locator("[data-chart][data-empty='0']")).to_have_count(2)
    expect(page.locator(".event-mark[data-type=warning]")).to_have_count(2)
    # The evaluation charts' axes read as the step charts' do.
    expect(page.locator("[data-eval-chart=accuracy]")).to_have_attribute("data-points", "3")
    assert_readable_y_axis(page, "accuracy", "[data-eval-chart=accuracy]")
    # This run reports no grad norms: nothing there is non-finite, only not reported.
    expect(page.locator("[data-chart=grad_norm] .empty-note")).to_have_text(
        "No grad norm recorded in this run."
    )
    page.locator("#timeline-filters [data-filter=checkpoint]").uncheck()
    expect(checkpoints).to_be_hidden()
    expect(page.locator("#timeline [data-type=warning]")).to_be_visible()
    page.locator("#timeline-filters [data-filter=checkpoint]").check()
    expect(checkpoints).to_be_visible()


def test_an_fp32_job_reads_without_hovering(page: Page, stack: Stack, tmp_path: Path) -> None:
    """Issue 43, at 1400x900: an fp32 job's loss scale is a one-line note, not an empty
    chart (so is any chart with nothing recorded); each legend reads the newest values before
    anything is hovered; every axis has a title; its one evaluation (at the last step) sits on
    an x axis from 0 to the run's 300 steps (uPlot padded a lone point to 600), and accuracy's
    y axis stays within the catalog's 0..1 (its padding reached above 1)."""
    page.set_viewport_size(WIDE)
    n = 300
    job = stack.submit(spec(name="fp32-plain", max_steps=n, precision="fp32"))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start("fp32")
        feed.steps(1, n)
        feed.evals(n, eval_loss=0.12, accuracy=0.995)
        feed.finish("succeeded", n)
    finally:
        feed.close()
    stack.recorded_history(job["id"], n)
    open_job(page, stack, job["id"])

    scale = page.locator("[data-chart=loss_scale]")
    expect(scale).to_have_attribute("data-empty", "1")
    expect(scale.locator(".empty-note")).to_have_text(
        "fp32 needs no loss scaling: only fp16 scales the loss."
    )
    expect(scale.locator(".plot")).to_be_hidden()
    memory = page.locator("[data-chart=memory]")  # this stand-in records no memory
    expect(memory.locator(".empty-note")).to_have_text("No memory recorded in this run.")
    loss = page.locator("[data-chart=loss]")
    expect(loss).to_have_attribute("data-empty", "0")
    expect(loss.locator(".plot")).to_be_visible()
    # The newest values, with nothing hovered: step 300 and its loss, raw and smoothed.
    values = loss.locator(".u-legend .u-series .u-value")
    expect(values.first).to_have_text(str(n))
    texts = values.all_inner_texts()
    assert "\N{EN DASH}" not in texts and abs(float(texts[1]) - 1 / n) < 1e-6, texts
    expect(loss).to_have_attribute("data-axes", "step|loss")
    expect(page.locator("[data-chart=lr]")).to_have_attribute("data-axes", "step|learning rate")

    accuracy = page.locator("[data-eval-chart=accuracy]")
    expect(accuracy).to_have_attribute("data-points", "1")
    expect(accuracy).to_have_attribute("data-axes", "step|accuracy")
    expect(accuracy).to_have_attribute("data-x-range", f"0,{n}")
    low, high = (float(v) for v in (accuracy.get_attribute("data-y-range") or "").split(","))
    assert 0 <= low < 0.995 < high <= 1, (low, high)
    expect(accuracy.locator(".u-legend .u-value").nth(1)).to_have_text("0.995")
    eval_loss = page.locator("[data-eval-chart=eval_loss]")
    expect(eval_loss).to_have_attribute("data-x-range", f"0,{n}")
    shot(page, "job-fp32-issue43", tmp_path)
