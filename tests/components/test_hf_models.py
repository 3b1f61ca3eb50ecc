"""Hugging Face transformers models from a config train through the real engine on the CPU:
every allowed causal language model type in fp32 and bf16 (one fp16 run with loss
scaling), and a sequence classifier on real text (which of two kinds of idlelib files a
run of bytes comes from). Small sizes keep each run to a second or two."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.components.base import DataInfo
from amptrain.contract.errors import PreemptedError
from amptrain.contract.layers import layer_paths
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.contract.zoo_text import CAUSAL_LM_TYPES
from amptrain.engine import RunContext, Trainer
from tests.support.sinks import ListSink

pytestmark = pytest.mark.heavy

SIZES = {"hidden_size": 32, "num_layers": 2, "num_heads": 4}


def _run(spec: dict[str, Any], data_roots: tuple[str, ...] = ()) -> ListSink:
    sink = ListSink()
    parsed = parse_spec({"device": "cpu", "schedule": {"name": "constant"}, **spec})
    result = Trainer(
        parsed, RunContext(checkpoint_dir=None, sink=sink, data_roots=data_roots)
    ).train()
    assert result.precision.effective == parsed.precision
    return sink


def _losses(sink: ListSink) -> list[float]:
    return [r["loss"] for r in sink.items if r["kind"] == "metric" and not r["skipped"]]


def _lm(model_type: str, precision: str, steps: int = 40) -> dict[str, Any]:
    extra = {"num_kv_heads": 2} if model_type in ("llama", "qwen2") else {}
    return {
        "model": {"name": "hf-causal-lm", "args": {"model_type": model_type, **SIZES, **extra}},
        "dataset": {"name": "synthetic-text", "args": {"vocab_size": 32, "seq_len": 16}},
        "max_steps": steps,
        "batch_size": 4,
        "precision": precision,
        "optimizer": {"lr": 3e-3},
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model_type", CAUSAL_LM_TYPES)
def test_each_causal_lm_type_learns_the_markov_chain(model_type: str, precision: str) -> None:
    losses = _losses(_run(_lm(model_type, precision)))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, f"{model_type}/{precision}: loss {first:.3f} -> {last:.3f}"


def test_fp16_with_loss_scaling_trains_a_library_model() -> None:
    sink = _run(_lm("llama", "fp16"))
    records = [r for r in sink.items if r["kind"] == "metric"]
    assert all(r["loss_scale"] for r in records)
    losses = _losses(sink)
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


def _idle_windows(length: int, per_kind: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs of ``length`` bytes from IDLE's Python source (0) and its release notes (1)."""
    idle = Path(sysconfig.get_paths()["stdlib"]) / "idlelib"
    kinds = [sorted(idle.glob("*.py")), [*sorted(idle.glob("NEWS*.txt")), idle / "HISTORY.txt"]]
    if not all(kinds) or not all(p.is_file() for p in kinds[1]):
        pytest.skip("this Python has no idlelib sources to classify")
    rows, labels = [], []
    for label, files in enumerate(kinds):
        data = np.frombuffer(b"".join(p.read_bytes() for p in files), dtype=np.uint8)
        starts = np.random.default_rng(label).choice(len(data) - length, per_kind, replace=False)
        rows += [data[s : s + length] for s in starts]
        labels += [label] * per_kind
    return np.stack(rows).astype(np.int64), np.array(labels, dtype=np.int64)


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "llama"])
def test_a_sequence_classifier_tells_code_from_prose(model_type: str, tmp_path: Path) -> None:
    x, y = _idle_windows(32, 300)
    np.savez(tmp_path / "idle.npz", x=x, y=y)
    spec = {
        "model": {"name": "hf-sequence-classifier", "args": {"model_type": model_type, **SIZES}},
        "dataset": {
            "name": "tensors",
            "args": {"path": "idle.npz", "task": "sequence_classification", "val_fraction": 0.2},
        },
        "max_steps": 60,
        "batch_size": 16,
        "precision": "bf16",
        "optimizer": {"lr": 2e-3},
        "eval": {"every_steps": 30, "batches": 8},
    }
    sink = _run(spec, (str(tmp_path),))
    final = [r for r in sink.items if r["kind"] == "eval"][-1]["values"]
    assert final["accuracy"] >= 0.75, final  # chance is 0.5


def test_the_model_is_the_librarys_own_and_returns_logits() -> None:
    info = DataInfo("language_model", (16,), 50)
    ref = ComponentRef(name="hf-causal-lm", args={"model_type": "gpt2", **SIZES})
    model = registry.build_model(ref, info)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert "transformer.h.0.attn.c_attn.weight" in dict(model.named_parameters())
    assert model(torch.zeros(3, 16, dtype=torch.long)).shape == (3, 16, 50)


def test_layer_norm_groups_are_the_library_modules() -> None:
    info = DataInfo("language_model", (16,), 50)
    for model_type, some_layer in [
        ("gpt2", "transformer.h.1.attn.c_attn"),
        ("llama", "model.layers.0.self_attn.q_proj"),
    ]:
        ref = ComponentRef(name="hf-causal-lm", args={"model_type": model_type, **SIZES})
        with torch.device("meta"):
            model = registry.build_model(ref, info)
        names = [n for n, _ in model.named_parameters()]
        paths = layer_paths(names)
        assert some_layer in paths
        # A deep model is grouped by block, never into one lump of every block.
        deep = {**SIZES, "num_layers": 40}
        with torch.device("meta"):
            big = registry.build_model(
                ComponentRef(name="hf-causal-lm", args={"model_type": model_type, **deep}), info
            )
        grouped = set(layer_paths([n for n, _ in big.named_parameters()]))
        blocks = {p for p in grouped if ".39." in p or p.endswith(".39")}
        assert blocks and len(grouped) >= 40, sorted(grouped)[:10]


def test_a_tied_library_model_resumes_exactly_from_its_checkpoint(tmp_path: Path) -> None:
    """GPT-2's head shares the token table: the checkpoint keeps them one tensor."""
    raw = _lm("gpt2", "bf16", steps=8)
    raw["model"]["args"]["dropout"] = 0.1  # the RNG state must round-trip too
    body = {**raw, "device": "cpu", "checkpoint": {"every_steps": 4, "keep_last": 2}}
    straight = Trainer(parse_spec(body), RunContext(str(tmp_path / "straight")))
    straight.train()
    first = Trainer(
        parse_spec(body),
        RunContext(
            str(tmp_path / "split"), should_stop=lambda: "preempt" if first.step == 4 else None
        ),
    )
    with pytest.raises(PreemptedError):
        first.train()
    second = Trainer(parse_spec(body), RunContext(str(tmp_path / "split")))
    assert second.train().resumed_from == 4
    inner = second.model
    assert inner.lm_head.weight is inner.transformer.wte.weight  # still tied after loading
    for (name, a), (_, b) in zip(
        straight.model.named_parameters(), second.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
