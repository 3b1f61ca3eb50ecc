"""Spec files: a job spec written as JSON or YAML, read into the mapping
:func:`~amptrain.contract.spec.parse_spec` validates (``amptrain train`` and ``amptrain
submit`` take one)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

SPEC_FILE_FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
"""How a spec file is read, by suffix (any case); other suffixes are refused."""

EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
"""Floats in exponent form that YAML 1.1 reads as strings and YAML 1.2 (and every user)
as numbers: ``1e6``, ``1E-3``, ``-2e+3``, ``1.0e6``. YAML 1.1's own float pattern wants a
dot and a signed exponent, so ``feature_scale: 1e6`` was the string ``'1e6'``."""


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's exponent floats added to its implicit
    resolvers (its own, and quoted strings, unchanged: ``"1e6"`` stays a string)."""


# add_implicit_resolver copies the inherited table first: yaml.SafeLoader is untouched.
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789."))


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
        data = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=SpecLoader)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the spec must be a mapping (a JSON object)")
    return data
