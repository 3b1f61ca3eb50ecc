"""Hugging Face text models at submit, against a real API (with an operator's memory limit
on one job): a 10^12-parameter config is a 422 naming ``model.args`` and its count before
anything is queued, and hostile arguments are 422s naming their field. The API process
imports no transformers (nor torch) to say so: the counts are torch-free formulas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.admission import spec_size
from amptrain.contract.spec import parse_spec
from tests.contract.test_zoo_text import TERA
from tests.server.web.test_http import fields
from tests.support.specs import mlp_job
from tests.support.stack import Stack


@pytest.fixture
def limited_api(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(tmp_path, database_url, redis_server)
    stack.env["AMPTRAIN_MAX_JOB_MEMORY_GIB"] = "256"
    stack.start_api()
    yield stack
    stack.close()


def _lm(**args: Any) -> dict[str, Any]:
    return mlp_job(
        model={"name": "hf-causal-lm", "args": args},
        dataset={"name": "synthetic-text", "args": {"vocab_size": 64, "seq_len": 32}},
    )


def test_a_tera_parameter_model_is_refused_at_submit(limited_api: Stack) -> None:
    c = limited_api.client
    r = c.post("/jobs", json=mlp_job(**TERA))
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    count = spec_size(parse_spec(mlp_job(**TERA)))
    assert count is not None and count.parameters is not None and count.parameters > 10**12
    assert problem["field"] == "model.args" and problem["type"] == "too_large"
    assert f"{count.parameters:,} parameters" in problem["message"]
    assert c.post("/jobs", json=_lm(model_type="qwen2", hidden_size=64)).status_code == 201


def test_hostile_arguments_are_422s_naming_the_field(limited_api: Stack) -> None:
    c = limited_api.client
    assert fields(c.post("/jobs", json=_lm(model_type="t5"))) == {"model.args.model_type"}
    assert fields(c.post("/jobs", json=_lm(model_type="../evil"))) == {"model.args.model_type"}
    assert fields(c.post("/jobs", json=_lm(hidden_size=10**9))) == {"model.args.hidden_size"}
    remote = c.post("/jobs", json=_lm(trust_remote_code=True))
    assert fields(remote) == {"model.args.trust_remote_code"}
    assert "unexpected argument" in remote.json()["detail"][0]["message"]
    heads = c.post("/jobs", json=_lm(hidden_size=100, num_heads=3))
    assert fields(heads) == {"model.args.num_heads"}
    assert "must divide hidden_size (100)" in heads.json()["detail"][0]["message"]
