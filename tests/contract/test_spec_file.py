"""The one spec-file loader, shared by ``amptrain train`` and ``amptrain submit``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from amptrain.contract.spec import parse_spec
from amptrain.contract.spec_file import load_spec_file

SPEC = {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 3}


@pytest.mark.parametrize("name", ["spec.json", "SPEC.JSON"])
def test_json_suffix_reads_json(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(SPEC))
    assert load_spec_file(path) == SPEC


@pytest.mark.parametrize("name", ["spec.yaml", "spec.yml", "spec.YML"])
def test_yaml_suffixes_read_yaml(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(SPEC))
    assert parse_spec(load_spec_file(path)).max_steps == 3


def test_yaml_text_in_a_json_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(yaml.safe_dump(SPEC))
    with pytest.raises(ValueError, match=r"spec\.json: not valid JSON"):
        load_spec_file(path)


@pytest.mark.parametrize("name", ["spec.txt", "spec", "spec.toml"])
def test_other_suffixes_are_refused_naming_the_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(SPEC))
    with pytest.raises(ValueError, match=r".json, .yaml, .yml") as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(("name", "text"), [("a.yaml", "- 1\n- 2\n"), ("b.yml", "key: [\n")])
def test_a_list_or_broken_yaml_is_refused_naming_the_file(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "example", ["mlp.yaml", "transformer.json", "cnn-fp16.yaml", "resnet18.yaml", "gpt2-small.yaml"]
)
def test_a_stored_spec_parses_again_as_the_worker_reads_it(example: str) -> None:
    # The API stores model_dump(mode="json"), nulls included; the worker parses that.
    root = Path(__file__).resolve().parents[2] / "amptrain" / "examples"
    spec = parse_spec(load_spec_file(root / example))
    stored = json.loads(json.dumps(spec.model_dump(mode="json")))
    assert parse_spec(stored) == spec


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e6", 1e6), ("1E-3", 1e-3), (".5", 0.5), ("-2e+3", -2000.0), ("1.0e6", 1e6), ("2", 2)],
)
def test_yaml_numbers_parse_as_users_expect(tmp_path: Path, text: str, value: float) -> None:
    """``feature_scale: 1e6`` (the README's fallback demo) is a number, not ``'1e6'``."""
    path = tmp_path / "spec.yaml"
    path.write_text(f"dataset: {{name: synthetic-classification, args: {{feature_scale: {text}}}}}")
    got = load_spec_file(path)["dataset"]["args"]["feature_scale"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ['"1e6"', "'1E-3'", "1e6x", "e6", "1e"])
def test_quoted_or_other_text_stays_a_string(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: {text}\n")
    assert isinstance(load_spec_file(path)["name"], str)
    assert yaml.safe_load("x: 1e6")["x"] == "1e6"  # PyYAML's own safe loader is untouched


def test_feature_scale_1e6_is_a_valid_spec(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "model: {name: mlp}\nmax_steps: 3\n"
        "dataset: {name: synthetic-classification, args: {features: 16, feature_scale: 1e6}}\n"
    )
    assert parse_spec(load_spec_file(path)).dataset.args["feature_scale"] == 1e6
