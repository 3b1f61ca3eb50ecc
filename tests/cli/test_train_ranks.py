"""The local runner's place in a data-parallel run comes from torchrun's variables through
bounded options: an impossible rank or world size is refused naming the option, before any
training (and before torch is imported)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from amptrain.cli.train import train


@pytest.mark.parametrize(
    ("env", "option"),
    [
        ({"WORLD_SIZE": "0"}, "--world-size"),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, "--rank"),
        ({"WORLD_SIZE": "2", "RANK": "99999999999999999999"}, "--rank"),
        ({"WORLD_SIZE": "9"}, "--world-size"),
        ({"WORLD_SIZE": "two"}, "--world-size"),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "8"}, "--local-rank"),
    ],
)
def test_impossible_torchrun_values_are_refused_naming_the_option(
    tmp_path: Path, env: dict[str, str], option: str
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps({"model": {"name": "mlp"}, "dataset": {"name": "synthetic-classification"}})
    )
    result = CliRunner().invoke(train, [str(spec)], env=env)
    assert result.exit_code == 2
    assert option in result.output
