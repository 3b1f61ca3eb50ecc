"""Whole-run export through the service: a run recorded by the real recorder (two attempts,
evaluations, layer norms, a non-finite loss) exported as Parquet and CSV, by HTTP and by
``amptrain export``, reads back as exactly what ``/metrics``, ``/evals`` and
``/layer-norms`` return at full resolution; a comparison's export adds the job. Real
uvicorn, Redis and database."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from amptrain.contract.records import layer_norms
from tests.support.producer import Producer
from tests.support.specs import mlp_job
from tests.support.stack import Stack, all_metrics, user_client, wait_until

pytestmark = pytest.mark.slow

Series = dict[tuple[str, str], dict[int, float | None]]


def norms(step: int) -> dict[str, float | None]:
    return {"net.0": 1.0 / step, "head": None if step == 20 else 2.0 * step}


def record_run(producer: Producer) -> None:
    """Attempt 1: steps 1..30, evals at 10, 20, 30, layer norms at 10, 20, 30. Attempt 2
    resumes from step 20: steps 21..40 (a new loss), evals at 30, 40, norms at 40, and a
    non-finite loss at 41."""
    producer.start()
    producer.steps(1, 30)
    producer.evals(10, 20, 30)
    assert producer.sink is not None
    producer.sink.write([layer_norms(s, 1000.0 + s, norms(s)) for s in (10, 20, 30)])
    producer.requeue(30)
    producer.start()
    producer.steps(21, 40, loss=0.25)
    producer.steps(41, 41, loss=float("nan"))
    producer.evals(30, 40, eval_loss=0.5, accuracy=None)
    producer.sink.write([layer_norms(40, 1040.0, norms(40))])
    producer.finish("succeeded", 41)


def api_series(client: httpx.Client, job_id: str) -> Series:
    """Every series as the cursor pages return it (the effective history, null kept)."""
    out: Series = {}
    for point in all_metrics(client, job_id):
        for field, value in point.items():
            if field not in ("step", "attempt", "cursor", "memory_peak_per_rank"):
                out.setdefault(("step", field), {})[point["step"]] = value
    for path, kind in (("evals", "eval"), ("layer-norms", "layer")):
        after = None
        while True:
            params = {"limit": 100, **({"after": after} if after else {})}
            page = client.get(f"/jobs/{job_id}/{path}", params=params).json()
            for item in page["items"]:
                for name, value in item["values"].items():
                    out.setdefault((kind, name), {})[item["step"]] = value
            if not page["items"]:
                break
            after = page["next_cursor"]
    # A field no point holds (no loss scale in fp32, no data-parallel fields) is no series.
    return {key: steps for key, steps in out.items() if any(v is not None for v in steps.values())}


def exported_series(table: pa.Table) -> Series:
    """The export's rows as series, checking its order: series after series, steps rising."""
    out: Series = {}
    rows = table.to_pydict()
    previous: tuple[str, str] | None = None
    for kind, name, step, value in zip(
        rows["kind"], rows["series"], rows["step"], rows["value"], strict=True
    ):
        key = (kind, name)
        if key != previous:
            assert key not in out, f"{key} comes back after another series"
            out[key] = {}
        else:
            assert step > max(out[key]), f"{key}: step {step} out of order"
        # pyarrow's CSV reader reads "nan" as null; Parquet keeps NaN.
        out[key][step] = None if value is None or math.isnan(value) else value
        previous = key
    return out


def download(client: httpx.Client, path: str, fmt: str) -> httpx.Response:
    response = client.get(path, params={"format": fmt})
    assert response.status_code == 200, response.text
    return response


def test_export_reads_back_as_every_series_at_full_resolution(
    api_stack: Stack, database_url: str, redis_server: Any, tmp_path: Path
) -> None:
    created = api_stack.client.post(
        "/comparisons", json={"spec": mlp_job(41, name="export"), "precisions": ["fp32", "bf16"]}
    )
    assert created.status_code == 201, created.text
    comparison = created.json()
    job_id = comparison["runs"][0]["job_id"]
    producer = Producer(redis_server.url, database_url, job_id)
    try:
        record_run(producer)
    finally:
        producer.close()
    client = api_stack.client
    wait_until(lambda: 40 in api_series(client, job_id).get(("eval", "eval_loss"), {}), 30, "evals")
    wanted = api_series(client, job_id)
    assert wanted[("step", "loss")][25] == 0.25 and wanted[("step", "loss")][5] == 0.2
    assert wanted[("step", "loss")][41] is None  # NaN recorded: null in the API, NaN exported
    assert wanted[("layer", "head")][20] is None and wanted[("eval", "accuracy")][40] is None

    parquet = download(client, f"/jobs/{job_id}/metrics/export", "parquet")
    assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
    assert f'filename="{job_id}.parquet"' in parquet.headers["content-disposition"]
    table = pq.read_table(io.BytesIO(parquet.content))
    assert table.schema.names == ["kind", "series", "step", "value"]
    assert pa.types.is_dictionary(table.schema.field("series").type)
    assert (table.schema.field("step").type, table.schema.field("value").type) == (
        pa.int64(),
        pa.float64(),
    )
    assert exported_series(table) == wanted

    csv = download(client, f"/jobs/{job_id}/metrics/export", "csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert exported_series(pa_csv.read_csv(io.BytesIO(csv.content))) == wanted
    assert csv.content.startswith(b'"kind","series","step","value"\n')
    assert b'"step","loss",41,nan\n' in csv.content

    # A comparison: every run's rows (the bf16 run recorded nothing), each with its job.
    both = pq.read_table(
        io.BytesIO(download(client, f"/comparisons/{comparison['id']}/export", "parquet").content)
    )
    assert both.schema.names[0] == "job" and set(both.column("job").to_pylist()) == {job_id}
    assert exported_series(both.drop_columns(["job"])) == wanted

    # The command line streams the same file to -o; "-o -" is stdout.
    out = tmp_path / "run.parquet"
    env = {**api_stack.env, "AMPTRAIN_URL": str(client.base_url), "AMPTRAIN_TOKEN": api_stack.token}
    cli = [sys.executable, "-m", "amptrain.cli.main", "export", job_id[:8]]
    done = subprocess.run([*cli, "-o", str(out)], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == parquet.content
    piped = subprocess.run(
        [*cli, "--format", "csv", "-o", "-"], env=env, capture_output=True, timeout=120
    )
    assert piped.returncode == 0 and piped.stdout == csv.content, piped.stderr

    # Another user's job and comparison do not exist for them; a format is one of two.
    with user_client(api_stack, "mallory") as other:
        for path in (f"/jobs/{job_id}/metrics/export", f"/comparisons/{comparison['id']}/export"):
            refused = other.get(path, params={"format": "csv"})
            assert refused.status_code == 404 and refused.json()["error"] == "not_found"
    for hostile in ("xlsx", "../../etc/passwd", "parquet\r\nX-Injected: 1", "P" * 5000):
        bad = client.get(f"/jobs/{job_id}/metrics/export", params={"format": hostile})
        assert bad.status_code == 422, bad.text
        assert [p["field"] for p in bad.json()["detail"]] == ["query.format"]
    missing = client.get("/jobs/j_0000000000000000/metrics/export")
    assert missing.status_code == 404
