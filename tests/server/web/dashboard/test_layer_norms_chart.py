"""Per-layer gradient norms end to end, in a real headless Chromium: a CPU job submitted
with ``telemetry.layer_grad_norms_every`` runs on the real worker (training child -> Redis
-> recorder -> SQL), ``GET /jobs/{id}/layer-norms`` holds every due step, and the job page
draws the "Layer gradient norms" chart, one line per layer; a job without the option shows
no such chart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.dashboard.conftest import screenshot, sign_in
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until

# The mlp (depth 2): Linear, LayerNorm, Linear, LayerNorm and the head Linear.
LAYERS = ["net.1", "net.2", "net.5", "net.6", "net.9"]


def test_a_job_with_layer_norms_charts_them_one_line_per_layer(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    telemetry = {"flush_every_steps": 5, "flush_every_ms": 200, "layer_grad_norms_every": 5}
    job = stack.submit(service_job("fp32", 60, name="layers", telemetry=telemetry))
    plain = stack.submit(service_job("fp32", 10, name="no-layers"))
    for j in (job, plain):
        wait_until(lambda j=j: stack.job(j["id"])["status"] == "succeeded", 120, "succeeded")

    def recorded() -> list[dict[str, object]] | None:
        items = stack.client.get(f"/jobs/{job['id']}/layer-norms").json()["items"]
        return items if len(items) == 12 else None

    items = wait_until(recorded, 30, "12 due steps recorded")
    assert [i["step"] for i in items] == list(range(5, 61, 5))
    assert all(list(i["values"]) == LAYERS for i in items)
    assert all(v is not None and v > 0 for i in items for v in i["values"].values())

    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job['id']}")
    chart = page.locator("[data-layer-chart]")
    expect(chart).to_be_visible()
    expect(chart).to_have_attribute("data-points", "12")
    expect(chart).to_have_attribute("data-layers", "5")
    expect(chart).to_contain_text("Layer gradient norms")
    expect(chart.locator(".u-legend .u-series")).to_have_count(1 + len(LAYERS))  # x + layers
    chart.scroll_into_view_if_needed()
    screenshot(page, "layer-norms", tmp_path)

    page.goto(f"/ui/#/jobs/{plain['id']}")
    expect(page.locator("#charts")).to_have_attribute("data-ready", "1")
    expect(page.locator("#timeline [data-type=succeeded]")).to_be_visible()
    expect(page.locator("[data-layer-chart]")).to_be_hidden()
