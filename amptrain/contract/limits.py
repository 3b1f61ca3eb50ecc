"""The bounds of every number and string in a job spec, as ``GET /catalog`` lists them.

Read from the spec's own JSON schema (the pydantic ``Field`` bounds the OpenAPI
schema shows), so the catalog and validation cannot disagree.
"""

from __future__ import annotations

from typing import Any

from amptrain.contract.spec import JobSpec

_KEYS = {
    "minimum": "minimum",
    "exclusiveMinimum": "exclusive_minimum",
    "maximum": "maximum",
    "exclusiveMaximum": "exclusive_maximum",
    "minLength": "min_length",
    "maxLength": "max_length",
    "maxProperties": "max_items",
    "pattern": "pattern",
}


def spec_limits() -> dict[str, dict[str, Any]]:
    """``{"batch_size": {"minimum": 1, "maximum": 65536}, "optimizer.betas.0": {...}, ...}``."""
    schema = JobSpec.model_json_schema()
    defs = schema.get("$defs", {})
    out: dict[str, dict[str, Any]] = {}
    _walk(schema, "", defs, out)
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        return dict(defs[node["$ref"].rsplit("/", 1)[-1]])
    options = [o for o in node.get("anyOf", ()) if o.get("type") != "null"]
    if len(options) == 1:  # ``X | None``: the bounds are X's
        return {**node, **_resolve(options[0], defs)}
    return node


def _walk(node: dict[str, Any], path: str, defs: dict[str, Any], out: dict[str, Any]) -> None:
    node = _resolve(node, defs)
    bounds = {key: node[k] for k, key in _KEYS.items() if k in node}
    if bounds and path:
        out[path] = bounds
    prefix = f"{path}." if path else ""
    for name, child in node.get("properties", {}).items():
        _walk(child, prefix + name, defs, out)
    for i, item in enumerate(node.get("prefixItems", ())):
        _walk(item, f"{path}.{i}", defs, out)


__all__ = ["spec_limits"]
