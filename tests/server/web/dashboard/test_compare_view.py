"""The compare view's overlay in headless Chromium: a metric picker (step and eval series),
a dash pattern per run so identical curves stay visible, the difference to the fp32
baseline, seed runs drawn as one mean with a min-max band, and a searchable job picker.
uPlot draws on canvas, so the page says what it drew in data-* attributes."""

from __future__ import annotations

import math
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.ab_runs import EVALS, RUNS, STEPS, spec
from tests.server.web.dashboard.conftest import WIDE, Console, screenshot, sign_in
from tests.support.producer import Producer
from tests.support.stack import Stack

MINUS = "\N{MINUS SIGN}"
TIMES = "\N{MULTIPLICATION SIGN}"
# Three fp32 runs of one spec that differ only by seed (near-identical losses), and one
# bf16 run of the same spec: (precision, seed, final loss).
RUNS_PLAYED = {
    "seed-1": ("fp32", 1, 0.50),
    "seed-2": ("fp32", 2, 0.52),
    "seed-3": ("fp32", 3, 0.48),
    "bf16-run": ("bf16", 1, 0.51),
}


def play(stack: Stack, job_id: str, precision: str, seed: int, final: float) -> None:
    """A loss falling from final + 2 towards final with the seed's noise, evaluated at
    mid-run and after the last step."""
    noise = random.Random(seed)
    producer = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job_id)
    try:
        producer.start(precision)
        for step in range(1, STEPS + 1):
            producer.record(
                step,
                loss=final + 2 * math.exp(-step / 12) + noise.uniform(-0.08, 0.08),
                samples_per_second=RUNS[precision]["samples_per_second"] * noise.uniform(0.9, 1.1),
                memory_peak=int(RUNS[precision]["memory_peak"] * step / STEPS),
                skipped=False,
                skipped_steps=0,
            )
            if step in (STEPS // 2, STEPS):
                producer.evals(step, **EVALS[precision])
        assert producer.sink is not None and producer.sink.flush()
        producer.finish("succeeded", STEPS)
    finally:
        producer.close()


@pytest.fixture(scope="module")
def runs(stack: Stack) -> dict[str, dict[str, Any]]:
    made: dict[str, dict[str, Any]] = {}
    for name, (precision, seed, final) in RUNS_PLAYED.items():
        made[name] = stack.submit(spec(name=name, seed=seed, precision=precision))
        play(stack, made[name]["id"], precision, seed, final)
    for job in made.values():  # the recorder has stored every point
        stack.recorded_history(job["id"], STEPS)
    return made


def open_compare(page: Page, stack: Stack, runs: dict[str, dict[str, Any]], *names: str) -> None:
    sign_in(page, stack.token)
    page.goto(f"/ui/#/compare?jobs={','.join(runs[n]['id'] for n in names)}")


def test_the_metric_picker_switches_what_is_drawn_and_the_link_keeps_it(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]]
) -> None:
    open_compare(page, stack, runs, "seed-1", "seed-2", "seed-3", "bf16-run")
    overlay = page.locator("#overlay")
    expect(overlay).to_have_attribute("data-series", "seed-1,seed-2,seed-3,bf16-run")
    expect(overlay).to_have_attribute("data-field", "loss")
    # Every step metric a chart shows and every eval metric of the catalog are offered.
    options = page.locator("#overlay-metric option")
    values = [options.nth(i).get_attribute("value") for i in range(options.count())]
    assert {"loss", "grad_norm", "samples_per_second", "memory_peak", "eval:accuracy"} <= set(
        values
    )
    page.select_option("#overlay-metric", "samples_per_second")
    expect(overlay).to_have_attribute("data-field", "samples_per_second")
    expect(page).to_have_url(re.compile(r"metric=samples_per_second"))
    expect(page.locator("#overlay-log")).to_be_disabled()  # as on the job page
    page.select_option("#overlay-x", "time")  # throughput over elapsed time
    expect(overlay).to_have_attribute("data-x", "time")
    expect(page).to_have_url(re.compile(r"x=time"))
    page.select_option("#overlay-x", "step")
    page.select_option("#overlay-metric", "eval:accuracy")
    expect(overlay).to_have_attribute("data-field", "accuracy")
    expect(overlay).to_have_attribute("data-points", "2,2,2,2")  # mid-run and final
    expect(page.locator("#overlay-smoothing")).to_be_disabled()
    page.select_option("#overlay-metric", "loss")
    expect(overlay).to_have_attribute("data-smoothing", "0.8")
    page.check("#overlay-log")
    expect(overlay).to_have_attribute("data-log", "10")
    set_smoothing(page, "0")
    expect(overlay).to_have_attribute("data-smoothing", "0")
    # The link, opened afresh, draws the same.
    page.reload()
    expect(overlay).to_have_attribute("data-log", "10")
    expect(overlay).to_have_attribute("data-smoothing", "0")
    expect(page.locator("#overlay-metric")).to_have_value("loss")
    expect(overlay).to_have_attribute("data-series", "seed-1,seed-2,seed-3,bf16-run")


def set_smoothing(page: Page, value: str) -> None:
    page.eval_on_selector(
        "#overlay-smoothing",
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
        value,
    )


def test_every_run_has_its_own_dash_and_a_difference_to_the_fp32_baseline(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    # bf16 picked first: the baseline is still the first picked fp32 run.
    open_compare(page, stack, runs, "bf16-run", "seed-2", "seed-1", "seed-3")
    overlay = page.locator("#overlay")
    expect(overlay).to_have_attribute("data-series", "bf16-run,seed-2,seed-1,seed-3")
    dashes = (overlay.get_attribute("data-dash") or "").split("|")
    assert len(dashes) == 4 and len(set(dashes)) == 4, dashes
    keys = page.locator("#overlay .overlay-key")
    expect(keys).to_have_count(4)
    assert [keys.nth(i).get_attribute("data-dash") for i in range(4)] == dashes
    diff = page.locator("#overlay-diff")
    expect(diff).to_have_attribute("data-baseline", "seed-2")
    labels = (diff.get_attribute("data-series") or "").split(",")
    assert labels == [f"{n} {MINUS} seed-2" for n in ("bf16-run", "seed-1", "seed-3")], labels
    expect(diff.locator("canvas")).to_have_count(1)
    screenshot(page, "compare-after", tmp_path)


def test_group_by_seed_draws_a_mean_and_a_band(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    open_compare(page, stack, runs, "seed-1", "seed-2", "seed-3", "bf16-run")
    overlay = page.locator("#overlay")
    expect(overlay).to_have_attribute("data-bands", "0")
    page.check("#overlay-group")
    expect(overlay).to_have_attribute("data-groups", "seed-1+seed-2+seed-3,bf16-run")
    # Named by what its runs share (issue 43: it read "seed-1 x3 seeds").
    lr = stack.job(runs["seed-1"]["id"])["spec"]["optimizer"]["lr"]
    group = f"fp32 · lr {lr:.0e}".replace("e-0", "e-") + " · 3 seeds"
    expect(overlay).to_have_attribute("data-series", f"{group},bf16-run")
    expect(overlay).to_have_attribute("data-bands", "1")
    expect(page.locator("#overlay .overlay-key").first).to_contain_text("mean of 3")
    # The difference chart takes every run against the baseline, a group's runs too.
    diff = page.locator("#overlay-diff")
    others = ("seed-2", "seed-3", "bf16-run")
    expect(diff).to_have_attribute("data-series", ",".join(f"{n} {MINUS} seed-1" for n in others))
    page.select_option("#overlay-baseline", runs["bf16-run"]["id"])
    others = ("seed-1", "seed-2", "seed-3")
    expect(diff).to_have_attribute("data-series", ",".join(f"{n} {MINUS} bf16-run" for n in others))
    expect(page.locator("#overlay-diff-note")).to_have_text(
        "Each run minus bf16-run at the same step."
    )
    expect(page).to_have_url(re.compile(r"group=1"))
    expect(page).to_have_url(re.compile(f"baseline={runs['bf16-run']['id']}"))
    screenshot(page, "compare-after-grouped", tmp_path)


def test_the_job_picker_filters_as_one_types(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]]
) -> None:
    open_compare(page, stack, runs, "seed-1")
    shown = page.locator("#pick-jobs label:visible")
    # Not "bf16" alone: it is hexadecimal, and a job id once held it (seed-1's, which the
    # filter then rightly showed too).
    page.fill("#pick-search", "bf16-run")
    expect(shown).to_have_count(1)
    expect(shown.first).to_contain_text("bf16-run")
    page.fill("#pick-search", runs["seed-3"]["id"])
    expect(shown).to_have_count(1)
    expect(shown.first).to_contain_text("seed-3")
    shown.first.locator("input").check()
    # Picked while filtered: seed-1 (from the link) stays picked, seed-3 joins it.
    expect(page.locator("#overlay")).to_have_attribute("data-series", "seed-1,seed-3")
    page.fill("#pick-search", "seed fp32")
    expect(shown).to_have_count(3)
    expect(page.locator("#pick-count")).to_have_text(re.compile(r"^3 of \d+\+? jobs shown$"))


def test_the_picker_pages_through_the_job_list(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]]
) -> None:
    for i in range(100):  # newer than the played runs: a first page of 100 holds none of them
        stack.submit(spec(name=f"filler-{i}"))
    open_compare(page, stack, runs, "seed-2")
    # A link names a job beyond the first page: it is read by id, picked and drawn.
    expect(page.locator("#overlay")).to_have_attribute("data-series", "seed-2")
    expect(page.locator("#pick-more")).to_be_visible()
    shown = page.locator("#pick-jobs label:visible")
    page.fill("#pick-search", "seed-3")  # on the second page: the search reads on
    expect(shown).to_have_count(1)
    expect(shown.first).to_contain_text("seed-3")
    expect(page.locator("#pick-more")).to_be_hidden()  # that was the last page
    page.reload()
    page.click("#pick-more")
    expect(page.locator("#pick-more")).to_be_hidden()
    # Every job of the module's stack (the played runs, these 100, any other test's).
    total = len(stack.client.get("/jobs", params={"limit": 200}).json()["items"])
    assert total >= 104
    expect(page.locator("#pick-jobs label")).to_have_count(total)


def test_smoothing_reads_one_point_per_bucket(page: Page, stack: Stack) -> None:
    """A downsampled answer keeps each bucket's first, last, min and max; where items say
    which is the bucket's last, the smoothed line is drawn through those only."""
    sign_in(page, stack.token)
    drawn = page.evaluate(
        """async () => {
        const { linePoints } = await import("/ui/js/overlay_data.js");
        const items = [1, 2, 3, 4, 5, 6, 7, 8].map((step) => ({
            step, loss: step % 2 ? 10 : 0, downsampled: true, bucket_last: step % 4 === 0 }));
        return { even: linePoints(items, "loss", { weight: 0.5 }),
            raw: linePoints(items, "loss"),
            old: linePoints(items.map(({ bucket_last, ...i }) => i), "loss", { weight: 0.5 }) };
    }"""
    )
    assert drawn["even"] == [[4, 8], [0, 0]]
    assert drawn["raw"][0] == [1, 2, 3, 4, 5, 6, 7, 8]  # unsmoothed: every point kept
    assert len(drawn["old"][0]) == 8  # a server without bucket_last: every point smoothed


def test_means_and_differences_line_runs_up_by_step(page: Page, stack: Stack) -> None:
    """Runs downsampled into different buckets keep different steps: the mean, the band
    and the difference read each line at the other's steps by interpolation."""
    sign_in(page, stack.token)
    got = page.evaluate(
        """async () => {
        const d = await import("/ui/js/overlay_data.js");
        const a = [[0, 10, 20], [1, 2, 3]];
        const b = [[0, 20], [3, 5]];  // 4 at step 10
        return { band: d.meanBand([a, b]), diff: d.difference(b, a),
            base: d.baselineIndex([{ precision: { effective: "bf16" } },
                                   { precision: { effective: "fp32" } }]),
            same: d.groupKey({ seed: 1, name: "x", a: { p: 1, q: 2 } })
                === d.groupKey({ a: { q: 2, p: 1 }, name: "y", seed: 2 }) };
    }"""
    )
    assert got["band"] == {"xs": [0, 10, 20], "mean": [2, 3, 4], "min": [1, 2, 3], "max": [3, 4, 5]}
    assert got["diff"] == [[0, 20], [2, 2]]
    assert got["base"] == 1  # the first fp32 run, not the first picked
    assert got["same"] is True  # seed and name aside, field order aside


def test_a_link_naming_thousands_of_jobs_is_cut_before_any_is_read(
    page: Page, stack: Stack, runs: dict[str, dict[str, Any]], console: Console
) -> None:
    """Issue 37: ``#/compare?jobs=`` naming 3,000 ids sent 3,000 ``GET /jobs/{id}`` with
    the reader's token. Now ids not shaped like a job id are dropped, at most 20 are kept
    (the first: here a played run and 19 unknown ones) and the page says the link was cut."""
    console.expect(404)  # the unknown ids kept
    unknown = [f"j_{i:032x}" for i in range(1, 3_000)]
    named = [runs["seed-1"]["id"], "../workers", "j_NOT-AN-ID", *unknown]
    reads: list[str] = []
    page.on(
        "request",
        lambda r: reads.append(r.url) if re.search(r"/jobs/[^/?]+(\?|$)", r.url) else None,
    )
    sign_in(page, stack.token)
    page.goto(f"/ui/#/compare?jobs={','.join(named)}")
    expect(page.locator("#overlay")).to_have_attribute("data-series", "seed-1")
    expect(page.locator("#pick-count")).to_contain_text("jobs shown")  # every read answered
    assert len(reads) <= 20, f"{len(reads)} job reads, first {reads[:3]}"
    assert all(re.search(r"/jobs/j_[0-9a-f]{32}(\?|$)", url) for url in reads), reads
    note = page.locator("#pick-link-note")
    expect(note).to_be_visible()
    expect(note).to_contain_text("2 entries that are not job ids were ignored")
    expect(note).to_contain_text("only the first 20 of its 3000 jobs were picked")


def test_identical_curves_are_named_and_a_flat_metric_reads_sane_ticks(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """Issue 43: three runs with the same points drew only the last one, and a flat line's
    ticks read "0.612 0.612 0.612 0.612"; an evaluation's y axis stays within its 0..1.
    Last in the module: its three jobs would change the filter's count above."""
    same = [stack.submit(spec(name=f"same-{c}", seed=7, precision="fp32")) for c in "abc"]
    for job in same:
        play(stack, job["id"], "fp32", 7, 0.6)
    for job in same:
        stack.recorded_history(job["id"], STEPS)
    page.set_viewport_size(WIDE)
    sign_in(page, stack.token)
    page.goto(f"/ui/#/compare?jobs={','.join(j['id'] for j in same)}")
    note = page.locator("#overlay .overlay-same")
    expect(note).to_have_text(
        "3 runs have identical loss curves: same-a, same-b, same-c (drawn on top of each other)."
    )
    expect(page.locator("#overlay")).to_have_attribute("data-axes", "step|loss")
    page.select_option("#overlay-metric", "eval:accuracy")
    expect(note).to_contain_text("3 runs have identical accuracy curves")
    # Every evaluation read 0.93: a flat line, its ticks each a different number within 0..1.
    overlay = page.locator("#overlay")
    expect(overlay).to_have_attribute("data-x-range", f"0,{STEPS}")
    low, high = (float(v) for v in (overlay.get_attribute("data-y-range") or "").split(","))
    assert 0 <= low < EVALS["fp32"]["accuracy"] < high <= 1, (low, high)
    labels = page.locator("#overlay .y-labels span").all_inner_texts()
    assert len(labels) >= 2 and len(set(labels)) == len(labels), labels
    screenshot(page, "compare-identical-curves", tmp_path)
