"""Layer-norm records through the recorder: kind ``layer_grad_norm`` rows in
their chunks beside the evaluations, exactly once, and every evaluation read (pages,
windows, newest cursor, ``eval_summary``) as if they were not there."""

from __future__ import annotations

import redis

from amptrain.contract.layers import LAYER_NORMS_MAX
from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.contract.records import evaluation, layer_norms
from amptrain.contract.stream import encode
from amptrain.core.redis import Keys
from amptrain.server.recorder.service import Recorder
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page
from amptrain.store.history.values import eval_page, newest_cursor
from tests.server.recorder.test_recorder import Sessions, job, point, publish, start_job


def test_layer_norms_are_their_own_series_and_evals_read_unchanged(
    sf: Sessions, r: redis.Redis
) -> None:
    job_id, attempt = start_job(sf)
    ev = evaluation(10, 1010.0, {"eval_loss": 0.5, "accuracy": 0.8})
    # A layer may share a name with an eval metric, at the same step.
    norms = {"blocks.0.attn": 1.5, "accuracy": 2.0, "(root)": float("inf")}
    publish(r, job_id, attempt, [point(i) for i in range(1, 11)])
    (eval_id,) = publish(r, job_id, attempt, [ev])
    (layer_id,) = publish(r, job_id, attempt, [layer_norms(10, 1010.0, norms)])
    too_many = layer_norms(11, 1011.0, {f"l{i}": 1.0 for i in range(LAYER_NORMS_MAX + 1)})
    bad_name = {**layer_norms(12, 1012.0, {}), "values": {"no spaces": 1.0}}
    for bad in (too_many, bad_name):  # each dropped alone, the rest recorded
        r.xadd(Keys.telemetry(job_id), encode(bad, job_id=job_id, attempt=attempt))  # type: ignore[arg-type]
    rec = Recorder(None, sf, r)
    rec.drain_once()
    publish(r, job_id, attempt, [layer_norms(10, 1010.0, norms)])  # re-sent: nothing new
    rec.drain_once()

    with sf() as s:
        evals, eval_cursor = eval_page(s, job_id, Page(limit=100))
        layers, layer_cursor = eval_page(s, job_id, Page(limit=100), LAYER_NORM_KIND)
        windowed = eval_window(s, job_id, 100)
        squeezed = eval_window(s, job_id, 1)
        layer_window = eval_window(s, job_id, 100, kind=LAYER_NORM_KIND)
        newest_eval = str(newest_cursor(s, job_id))
    assert [(e["step"], e["values"], e["cursor"]) for e in evals] == [
        (10, {"eval_loss": 0.5, "accuracy": 0.8}, eval_id)
    ]
    assert eval_cursor == newest_eval == eval_id  # not the later layer entry's
    assert [e["values"] for e in windowed.items] == [{"eval_loss": 0.5, "accuracy": 0.8}]
    assert windowed.next_cursor == eval_id and len(squeezed.items) == 1
    assert [(i["step"], i["values"], i["cursor"]) for i in layers] == [
        (10, {"blocks.0.attn": 1.5, "accuracy": 2.0, "(root)": None}, layer_id)
    ]
    assert layer_cursor == layer_id and layer_window.next_cursor == layer_id
    assert [i["values"] for i in layer_window.items] == [layers[0]["values"]]
    assert job(sf, job_id).eval_summary == {
        "step": 10,
        "attempt": attempt,
        "values": {"accuracy": 0.8, "eval_loss": 0.5},
    }


def test_a_layer_only_job_has_no_eval_summary(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(1), layer_norms(1, 1001.0, {"net.1": 0.1})])
    Recorder(None, sf, r).drain_once()
    with sf() as s:
        assert eval_page(s, job_id)[0] == [] and newest_cursor(s, job_id) is None
        assert eval_window(s, job_id, 10).items == []
    assert job(sf, job_id).eval_summary is None
