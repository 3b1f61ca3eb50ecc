"""Strict-JSON cleaning shared by the recorder, the live watchers and (if it wants) the worker.

FastAPI-free. PostgreSQL JSON columns and browsers' ``JSON.parse`` both reject
NaN and infinities, so those become ``null`` everywhere the API emits or stores
JSON.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """Return ``value`` with every non-finite float (nested in dicts/lists too) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
