"""The Hugging Face text models' contract: exact parameter counts (checked against the real
models built on the meta device), the allow-lists and bounds that refuse hostile specs
with the field named, the 10^12-parameter config refused before anything allocates, and
building that never reaches the network."""

from __future__ import annotations

import ast
import inspect
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from amptrain.components import hf_models, registry
from amptrain.components.base import DataInfo
from amptrain.contract import zoo_text
from amptrain.contract.admission import ServicePolicy, admission_problems, spec_size
from amptrain.contract.catalog import builtins, validate_components
from amptrain.contract.sizing import DataShape
from amptrain.contract.spec import ComponentRef, parse_spec

GIB = 2**30
SIZES: list[dict[str, Any]] = [
    {"hidden_size": 32, "num_layers": 1, "num_heads": 4},
    {"hidden_size": 64, "num_layers": 3, "num_heads": 8, "intermediate_size": 40},
    {"hidden_size": 96, "num_layers": 2, "num_heads": 6, "num_kv_heads": 6, "dropout": 0.1},
    {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},  # GQA types only
]


def _cases(name: str, types: tuple[str, ...]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (name, t, sizes)
        for t in types
        for sizes in SIZES
        if not sizes.get("num_kv_heads")
        or t in zoo_text.GROUPED_QUERY_TYPES
        or sizes["num_kv_heads"] == sizes["num_heads"]
    ]


CASES = _cases("hf-causal-lm", zoo_text.CAUSAL_LM_TYPES) + _cases(
    "hf-sequence-classifier", zoo_text.SEQUENCE_CLASSIFIER_TYPES
)


@pytest.mark.parametrize(("name", "model_type", "sizes"), CASES)
def test_parameter_formulas_match_the_library_models(
    name: str, model_type: str, sizes: dict[str, Any]
) -> None:
    reg = builtins("model")[name]
    args = {"model_type": model_type, **sizes}
    assert reg.arg_errors(args) == []
    if name == "hf-causal-lm":
        info, shape = DataInfo("language_model", (24,), 77), DataShape((24,), 77, 0)
    else:
        info = DataInfo("classification", (24,), 5, vocab_size=300)
        shape = DataShape((24,), 5, 0, vocab_size=300)
    with torch.device("meta"):
        model = registry.build_model(ComponentRef(name=name, args=args), info)
    real = sum(p.numel() for p in model.parameters())
    assert reg.parameters is not None
    assert reg.parameters(shape, reg.with_defaults(args)) == real


def test_the_spec_size_of_a_causal_lm_is_its_formula() -> None:
    spec = parse_spec(
        {
            "model": {"name": "hf-causal-lm", "args": {"model_type": "llama"}},
            "dataset": {"name": "synthetic-text", "args": {"vocab_size": 100, "seq_len": 20}},
            "max_steps": 1,
        }
    )
    size = spec_size(spec)
    assert size is not None
    with torch.device("meta"):
        model = registry.build_model(spec.model, DataInfo("language_model", (20,), 100))
    assert size.parameters == sum(p.numel() for p in model.parameters())


TERA = {
    "model": {
        "name": "hf-causal-lm",
        "args": {
            "model_type": "llama",
            "hidden_size": 16_384,
            "num_layers": 256,
            "num_heads": 128,
            "intermediate_size": 65_536,
        },
    },
    "dataset": {"name": "synthetic-text", "args": {"vocab_size": 32_768, "seq_len": 4096}},
    "max_steps": 1,
}


def test_a_tera_parameter_config_is_refused_by_its_count_before_anything_allocates() -> None:
    spec = parse_spec(TERA)
    assert validate_components(spec) == []  # every size is within its bound
    size = spec_size(spec)
    assert size is not None and size.parameters is not None
    assert 10**12 < size.parameters < 2 * 10**12
    (problem,) = admission_problems(spec, "alice", ServicePolicy(max_job_memory_bytes=256 * GIB))
    assert problem["loc"] == ["model", "args"] and problem["type"] == "too_large"
    assert f"{size.parameters:,} parameters" in problem["msg"]


def _errors(model_args: dict[str, Any], name: str = "hf-causal-lm") -> dict[str, str]:
    spec = parse_spec(
        {
            "model": {"name": name, "args": model_args},
            "dataset": {"name": "synthetic-text"},
            "max_steps": 1,
        }
    )
    return {".".join(e["loc"]): e["msg"] for e in validate_components(spec)}


def test_hostile_arguments_are_refused_naming_the_field() -> None:
    t5 = _errors({"model_type": "t5"})
    assert "must be one of gpt2, llama, qwen2, gpt_neox; got 't5'" in t5["model.args.model_type"]
    assert "model.args.model_type" in _errors({"model_type": "my-remote-model"})
    assert "must be <= 16384" in _errors({"hidden_size": 10**9})["model.args.hidden_size"]
    assert "must be <= 256" in _errors({"num_layers": 100_000})["model.args.num_layers"]
    remote = _errors({"trust_remote_code": True})["model.args.trust_remote_code"]
    assert remote.startswith("unexpected argument; allowed: dropout, hidden_size")
    heads = _errors({"hidden_size": 100, "num_heads": 3})
    assert heads == {"model.args.num_heads": "must divide hidden_size (100); got 3"}
    kv = _errors({"model_type": "gpt2", "num_heads": 4, "num_kv_heads": 2})
    assert "gpt2 has no grouped-query attention" in kv["model.args.num_kv_heads"]
    gqa = _errors({"model_type": "llama", "num_heads": 4, "num_kv_heads": 3})
    assert gqa == {"model.args.num_kv_heads": "must divide num_heads (4); got 3"}
    odd = _errors({"model_type": "llama", "hidden_size": 36, "num_heads": 4})
    assert "must be even" in odd["model.args.num_heads"]
    neox = _errors({"model_type": "gpt_neox", "hidden_size": 32, "num_heads": 8})
    assert "multiple of 8" in neox["model.args.num_heads"]
    bert = _errors({"model_type": "bert"})  # an encoder is no causal language model
    assert "must be one of gpt2, llama, qwen2, gpt_neox" in bert["model.args.model_type"]


def test_data_kinds_match_models_to_datasets_at_submit() -> None:
    def check(model: str, dataset: dict[str, Any]) -> list[dict[str, Any]]:
        return validate_components(
            parse_spec({"model": {"name": model}, "dataset": dataset, "max_steps": 1})
        )

    tensors = {"name": "tensors", "args": {"path": "x.npz", "task": "sequence_classification"}}
    assert check("hf-sequence-classifier", tensors) == []
    assert check("hf-causal-lm", {"name": "synthetic-text"}) == []
    lm_file = {"name": "tensors", "args": {"path": "x.npz", "task": "language_model"}}
    assert check("hf-causal-lm", lm_file) == []
    (wrong,) = check("hf-sequence-classifier", {"name": "synthetic-text"})
    assert wrong["loc"] == ["model", "name"] and "yields tokens" in wrong["msg"]
    (lm,) = check("hf-causal-lm", tensors)
    assert "takes tokens, but dataset 'tensors' yields sequences" in lm["msg"]
    (mlp,) = check("mlp", tensors)
    assert "yields sequences" in mlp["msg"]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every attempt to open a connection or resolve a name is recorded and refused."""
    tried: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        tried.append(args)
        raise OSError("network use in a test that must not reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield tried


def test_building_never_touches_the_network(no_network: list[Any]) -> None:
    for name, info, types in [
        ("hf-causal-lm", DataInfo("language_model", (16,), 50), zoo_text.CAUSAL_LM_TYPES),
        (
            "hf-sequence-classifier",
            DataInfo("classification", (16,), 3, vocab_size=40),
            zoo_text.SEQUENCE_CLASSIFIER_TYPES,
        ),
    ]:
        for model_type in types:
            ref = ComponentRef(name=name, args={"model_type": model_type, "hidden_size": 32})
            logits = registry.build_model(ref, info)(torch.zeros(2, 16, dtype=torch.long))
            assert logits.shape[0] == 2
    assert no_network == []
    # Nor can it: the builder's code names neither a download nor a repository's code.
    tree = ast.parse(inspect.getsource(hf_models))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg}
    assert "from_config" in used
    assert not used & {"from_pretrained", "trust_remote_code", "pretrained_model_name_or_path"}
