"""Hugging Face transformers text models, built from a config: never downloaded.

Torch-free (and transformers-free): the registrations name their builders in
``amptrain.components.hf_models`` as strings. A job picks an architecture from a short
allow-list (``model_type``) and its sizes; the vocabulary and the context length come
from the dataset. The builder calls ``AutoConfig.for_model`` and ``from_config`` only:
no hub name, no ``from_pretrained``, no ``trust_remote_code`` (it is not an argument,
so a spec naming it is refused as an unexpected argument).

Each allowed type has an exact parameter-count formula below (checked against the real
model built on the meta device by ``tests/contract/test_zoo_text.py``), so the API
sizes a job from its spec and refuses a 10^12-parameter config at submit. A type
without an exact formula is not on the list.

Choices the formulas follow: GPT-2 ties its output head to the token embedding (the
library's default); Llama, Qwen2 and GPT-NeoX keep a separate ``lm_head`` (theirs).
``intermediate_size`` 0 means 4 x ``hidden_size`` for every type; ``num_kv_heads`` 0
means ``num_heads`` (grouped-query attention only where the type has it). A sequence
classifier's token table has one row more than the data's vocabulary: the padding id
(``pad_token_id``, which the library needs to pick each sequence's last token when a
batch holds more than one) is that extra id, which the data never holds, so every
sequence is classified from its last token and no real token loses its gradient to
``padding_idx``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amptrain.contract.registration import Arg, Registration
from amptrain.contract.sizing import DataShape

CAUSAL_LM_TYPES = ("gpt2", "llama", "qwen2", "gpt_neox")
"""``hf-causal-lm``'s allow-list: types whose parameter count is given exactly below."""
SEQUENCE_CLASSIFIER_TYPES = ("bert", "gpt2", "llama")
"""``hf-sequence-classifier``'s allow-list."""
GROUPED_QUERY_TYPES = frozenset({"llama", "qwen2"})
"""Types with separate key/value heads (``num_kv_heads``)."""
ROTARY_TYPES = frozenset({"llama", "qwen2", "gpt_neox"})
"""Types with rotary position embeddings (rotated in pairs: a head's width must be even)."""

OFFLINE_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Set in every worker training process before it imports the Hugging Face libraries
(which read them once, at import), by its supervisor (``child_env``): the training core
reads and writes no environment. ``amptrain train`` runs on the user's own machine and
leaves its environment alone; the builder downloads nothing either way."""

_B = "amptrain.components.hf_models"
_REQUIRES = ("transformers",)


def _size_args(types: tuple[str, ...], default_type: str) -> tuple[Arg, ...]:
    return (
        Arg("model_type", default_type, "Architecture (transformers' model_type).", choices=types),
        Arg(
            "hidden_size", 128, "Hidden width; num_heads must divide it.", minimum=8, maximum=16_384
        ),
        Arg("num_layers", 2, "Transformer blocks.", minimum=1, maximum=256),
        Arg("num_heads", 4, "Attention heads.", minimum=1, maximum=256),
        Arg(
            "num_kv_heads",
            0,
            "Key/value heads (grouped-query attention; llama and qwen2 only); they must "
            "divide num_heads. 0 = num_heads.",
            minimum=0,
            maximum=256,
        ),
        Arg(
            "intermediate_size",
            0,
            "Feed-forward width; 0 = 4 x hidden_size.",
            minimum=0,
            maximum=262_144,
        ),
        Arg(
            "dropout",
            0.0,
            "Dropout probability (where the type has dropout).",
            minimum=0,
            maximum=0.99,
        ),
    )


def head_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """How the sizes may not fit one another (checked at submit)."""
    kind, hidden, heads = args["model_type"], args["hidden_size"], args["num_heads"]
    kv = args["num_kv_heads"]
    if hidden % heads:
        return [("num_heads", f"must divide hidden_size ({hidden}); got {heads}")]
    problems = []
    if kv and kind not in GROUPED_QUERY_TYPES and kv != heads:
        problems.append(
            ("num_kv_heads", f"{kind} has no grouped-query attention: give 0 or {heads}; got {kv}")
        )
    elif kv and heads % kv:
        problems.append(("num_kv_heads", f"must divide num_heads ({heads}); got {kv}"))
    head_dim = hidden // heads
    # GPT-NeoX rotates a quarter of each head (rotary_pct 0.25), the others all of it.
    rotated = head_dim // 4 if kind == "gpt_neox" else head_dim
    if kind in ROTARY_TYPES and (rotated == 0 or rotated % 2):
        need = "a multiple of 8 (a quarter of each head is rotated, in pairs)"
        if kind != "gpt_neox":
            need = "even (rotary embeddings rotate pairs)"
        problems.append(
            ("num_heads", f"{kind}: hidden_size / num_heads must be {need}; got {head_dim}")
        )
    return problems


def mlp_width(args: Mapping[str, Any]) -> int:
    """The feed-forward width the builder gives the library (one definition for both)."""
    return int(args["intermediate_size"] or 4 * args["hidden_size"])


def kv_heads(args: Mapping[str, Any]) -> int:
    return int(args["num_kv_heads"] or args["num_heads"])


def _trunk(kind: str, vocab: int, positions: int, args: Mapping[str, Any]) -> int:
    """Embeddings and blocks, up to the final norm (no output head)."""
    d, layers, inner = args["hidden_size"], args["num_layers"], mlp_width(args)
    if kind == "gpt2":  # Conv1D layers with biases, two LayerNorms a block, learned positions
        block = (3 * d * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 4 * d
        return vocab * d + positions * d + layers * block + 2 * d
    if kind in ("llama", "qwen2"):  # no biases but qwen2's q/k/v, RMSNorms (weight only)
        kv = kv_heads(args) * (d // args["num_heads"])
        attention = 2 * d * d + 2 * d * kv + ((d + 2 * kv) if kind == "qwen2" else 0)
        block = attention + 3 * d * inner + 2 * d
        return vocab * d + layers * block + d
    if kind == "gpt_neox":  # fused qkv, biases everywhere, LayerNorms
        block = (3 * d * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 4 * d
        return vocab * d + layers * block + 2 * d
    if kind == "bert":  # word, position and two token-type embeddings, post-LayerNorm
        block = 4 * (d * d + d) + 2 * d + (d * inner + inner) + (inner * d + d) + 2 * d
        embeddings = vocab * d + positions * d + 2 * d + 2 * d
        return embeddings + layers * block + (d * d + d)  # + the pooler
    raise ValueError(f"no parameter formula for model_type {kind!r}")


def causal_lm_parameters(data: DataShape, args: Mapping[str, Any]) -> int:
    kind, d = args["model_type"], args["hidden_size"]
    trunk = _trunk(kind, data.classes, data.input_shape[0], args)
    return trunk if kind == "gpt2" else trunk + data.classes * d  # GPT-2 ties its head


def sequence_classifier_parameters(data: DataShape, args: Mapping[str, Any]) -> int:
    if data.vocab_size is None:
        raise ValueError("a sequence classifier's size needs the dataset's vocabulary")
    kind, d, classes = args["model_type"], args["hidden_size"], data.classes
    trunk = _trunk(kind, data.vocab_size + 1, data.input_shape[0], args)  # + the padding id
    head = d * classes + classes if kind == "bert" else d * classes  # score has no bias
    return trunk + head


TEXT_MODELS: tuple[Registration, ...] = (
    Registration(
        "hf-causal-lm",
        "model",
        f"{_B}:build_causal_lm",
        "A Hugging Face transformers causal language model (GPT-2, Llama, Qwen2 or "
        "GPT-NeoX) built untrained from a config: vocabulary and context length from the "
        "dataset, sizes from the arguments. Never downloads anything.",
        _size_args(CAUSAL_LM_TYPES, "gpt2"),
        accepts=("tokens",),
        requires=_REQUIRES,
        parameters=causal_lm_parameters,
        rules=head_rules,
    ),
    Registration(
        "hf-sequence-classifier",
        "model",
        f"{_B}:build_sequence_classifier",
        "A Hugging Face transformers sequence classifier (BERT, GPT-2 or Llama) built "
        "untrained from a config, for token-id sequences with one class label each (the "
        "tensors dataset's task sequence_classification). Never downloads anything.",
        _size_args(SEQUENCE_CLASSIFIER_TYPES, "bert"),
        accepts=("sequences",),
        requires=_REQUIRES,
        parameters=sequence_classifier_parameters,
        rules=head_rules,
    ),
)
