"""Spec files: a job spec written as JSON or YAML, read into the mapping
:func:`~amptrain.contract.spec.parse_spec` validates (``amptrain train`` and ``amptrain
submit`` take one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

SPEC_FILE_FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
"""How a spec file is read, by suffix (any case); other suffixes are refused."""


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a spec file: JSON for ``.json``, YAML for ``.yaml``/``.yml``.

    Raises ``ValueError`` naming the file for another suffix, text that does not
    parse, or a document that is not a mapping (``OSError`` if it cannot be read).
    """
    path = Path(path)
    kind = SPEC_FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"{path}: a spec file must end in {', '.join(SPEC_FILE_FORMATS)} (JSON or YAML)"
        )
    text = path.read_text()
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the spec must be a mapping (a JSON object)")
    return data
