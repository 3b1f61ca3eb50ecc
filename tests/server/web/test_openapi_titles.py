"""What /docs shows a newcomer: every operation titled by a summary the route sets (not
FastAPI's title-cased function name, "Read Me" for GET /me), and a bad precision's 422
naming every precision there is, from the one definition (no server needed)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from amptrain.contract.builtins import PRECISIONS
from amptrain.contract.spec import JobSpec, Precision
from amptrain.core.settings import Settings
from amptrain.server.web.app import create_app


def mangled(name: str) -> str:
    """FastAPI's default title for a function ``name``: ``read_me`` -> ``Read Me``."""
    return name.replace("_", " ").title()


def test_every_operation_has_a_summary_its_route_sets(tmp_path: Path) -> None:
    schema = create_app(Settings(data_dir=tmp_path)).openapi()  # needs no running service
    operations = [
        (method, path, op) for path, ops in schema["paths"].items() for method, op in ops.items()
    ]
    assert len(operations) >= 25
    for method, path, op in operations:
        # FastAPI's operationId is the function's name, then the path and method.
        function = op["operationId"].removesuffix(re.sub(r"\W", "_", path) + f"_{method}")
        assert op["summary"] != mangled(function), (method, path, op["summary"])
        assert re.fullmatch(r"[A-Z][^_]{2,60}", op["summary"]), (method, path, op["summary"])
    titles = {(m, p): op["summary"] for m, p, op in operations}
    assert titles[("get", "/me")] == "The caller: who the token belongs to"


def test_a_bad_precision_names_every_precision_of_the_one_definition() -> None:
    allowed = typing.get_args(Precision)
    assert set(allowed) == set(PRECISIONS)  # the catalog's precisions are the spec's
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(spec(precision="fp8"))
    (error,) = info.value.errors()
    assert error["loc"] == ("precision",)
    for name in allowed:
        assert f"'{name}'" in error["msg"], error["msg"]  # tf32 too


def spec(**overrides: Any) -> dict[str, Any]:
    base = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 3}
    return {**base, **overrides}
