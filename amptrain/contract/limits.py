"""The bounds of every number and string in a job spec, as ``GET /catalog`` lists them,
and the bounds on one image that every image dataset applies.

The spec's bounds are read from its own JSON schema (the pydantic ``Field`` bounds the
OpenAPI schema shows), so the catalog and validation cannot disagree.
"""

from __future__ import annotations

from typing import Any

from amptrain.contract.spec import JobSpec

MAX_IMAGE_BYTES = 64 * 2**20
"""Bytes of one encoded image (a file, a tar member, a table cell) that is read and decoded
(a 24-megapixel JPEG is about 10 MiB); a larger one is refused, never read."""
MAX_IMAGE_PIXELS = 2**26
"""Pixels (width x height) an image may declare, checked from its header before a pixel is
decoded (a 100-byte PNG can declare 20,000 x 20,000: 1.2 GB decoded). 8192 x 8192, 192 MiB
decoded as RGB: the one bound for every dataset because it admits the photos of full-frame
cameras (61-megapixel sensors: 9504 x 6336) and 8K squares, where 2**25 refused
45-megapixel photos, and stays below Pillow's own decompression-bomb warning (89.5
megapixels), so an image accepted here never warns. The footprints count one decoded
image of this size in flight."""

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


__all__ = ["MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "spec_limits"]
