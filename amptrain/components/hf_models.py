"""Hugging Face transformers text models, built untrained from a config.

The registrations (allow-lists, bounds, exact parameter counts) are in
:mod:`amptrain.contract.zoo_text`. Only ``AutoConfig.for_model`` and ``from_config``
are called here: they build from the library's own code, locally, so no job can make a
worker download weights or run a model repository's code (``from_pretrained`` and
``trust_remote_code`` appear nowhere). The worker starts every training process with
``HF_HUB_OFFLINE=1`` as well (``amptrain.worker.pool.child_handle.child_env``), so even
a library path that would reach the hub fails instead; this module reads and writes no
environment, as nothing in the training engine does.

The library's ``forward(input_ids)`` returns a ``ModelOutput``; a forward hook
(:func:`_logits`) makes it return the ``logits`` as every amptrain model does, so the
model stays the library's own module: its parameters, checkpoints, per-layer norms,
overflow attribution and safetensors exports all carry the library's names
(``transformer.h.0.attn.c_attn.weight``), and a weights file the library saved loads as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from amptrain.components.base import DataInfo
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.zoo_text import kv_heads, mlp_width


def _logits(module: nn.Module, args: Any, output: Any) -> torch.Tensor:
    """A forward hook: what the library's forward returns, reduced to its logits
    (``(batch, seq_len, vocab)`` for a causal LM, ``(batch, classes)`` for a classifier)."""
    logits: torch.Tensor = output.logits
    return logits


def _returning_logits(model: nn.Module) -> nn.Module:
    model.register_forward_hook(_logits)  # kept by deepcopy (the auto-precision probe)
    return model


def _sizes(kind: str, args: Mapping[str, Any], positions: int) -> dict[str, Any]:
    """The config keywords of ``kind`` for amptrain's size arguments."""
    d, layers, heads, drop = (
        args["hidden_size"],
        args["num_layers"],
        args["num_heads"],
        args["dropout"],
    )
    inner = mlp_width(args)
    if kind == "gpt2":
        return {
            "n_embd": d,
            "n_layer": layers,
            "n_head": heads,
            "n_inner": inner,
            "n_positions": positions,
            "resid_pdrop": drop,
            "embd_pdrop": drop,
            "attn_pdrop": drop,
        }
    common = {
        "hidden_size": d,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": inner,
        "max_position_embeddings": positions,
    }
    if kind in ("llama", "qwen2"):
        return {**common, "num_key_value_heads": kv_heads(args), "attention_dropout": drop}
    if kind == "gpt_neox":
        return {**common, "attention_dropout": drop, "hidden_dropout": drop}
    if kind == "bert":
        return {**common, "hidden_dropout_prob": drop, "attention_probs_dropout_prob": drop}
    raise InvalidSpecError(f"model.args.model_type: no config mapping for {kind!r}")


def _config(kind: str, args: Mapping[str, Any], vocab: int, positions: int, **extra: Any) -> Any:
    # Generation's special ids would default to the pretrained vocabulary's (GPT-2's 50256),
    # outside this one: none are used in training, so none are set.
    return AutoConfig.for_model(
        kind,
        vocab_size=vocab,
        use_cache=False,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=kind == "gpt2",  # what zoo_text's parameter formulas assume
        **_sizes(kind, args, positions),
        **extra,
    )


def build_causal_lm(
    info: DataInfo,
    model_type: str = "gpt2",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 0,
    intermediate_size: int = 0,
    dropout: float = 0.0,
) -> nn.Module:
    """``AutoModelForCausalLM.from_config``: vocabulary and context length from ``info``."""
    args = dict(locals())
    config = _config(model_type, args, info.num_classes, info.input_shape[0], pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return _returning_logits(model)


def build_sequence_classifier(
    info: DataInfo,
    model_type: str = "bert",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 0,
    intermediate_size: int = 0,
    dropout: float = 0.0,
) -> nn.Module:
    """``AutoModelForSequenceClassification.from_config`` with ``info``'s classes. The
    padding id is one past the data's vocabulary (which the token table gets one row
    for): the data never holds it, so the library reads every sequence's last token (the
    first, [CLS]-style, for BERT), whatever the batch size."""
    args = dict(locals())
    vocab = info.vocab_size
    if vocab is None:
        raise InvalidSpecError(
            "model.name: hf-sequence-classifier needs token-id sequences with class labels"
        )
    config = _config(
        model_type,
        args,
        vocab + 1,
        info.input_shape[0],
        pad_token_id=vocab,
        num_labels=info.num_classes,
    )
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
    return _returning_logits(model)
