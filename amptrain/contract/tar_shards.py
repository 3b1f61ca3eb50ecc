"""The ``webdataset`` dataset's bounds, footprint and argument rules (torch-free: the API
checks them at submit). The reader is ``amptrain.components.webdataset``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from amptrain.contract.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from amptrain.contract.sizing import DataShape

MAX_MEMBERS = 1_000_000
"""Members one shard may hold (WebDataset shards hold thousands: ~1 GB of samples each)."""
MAX_MEMBER_NAME = 1024
"""Characters of a member's name (a pax header may carry any length)."""
MAX_CLASSES = 10_000_000
"""Largest label + 1 when ``num_classes`` is not given."""
INDEX_BYTES_PER_SAMPLE = 16
"""The index: each sample's image offset (int64), size (uint32) and label (int32)."""

_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,19}")


def keys_of(text: str) -> list[str]:
    """The extensions a ``;``-separated key argument names (``"jpg;png"``), lower-cased."""
    return [k.lower() for k in text.split(";")]


def webdataset_footprint(args: Mapping[str, Any]) -> DataShape | None:
    """Images of ``channels x image_size x image_size``; the classes only with ``num_classes``
    (otherwise they are read from the shards: None). What the arguments fix of the memory
    held is one image member and its decoded pixels in flight; the index (16 bytes a
    sample) is known once the shards' headers are read: the built dataset's
    ``resident_bytes`` says it and the worker checks it as it indexes."""
    if not args["num_classes"]:
        return None
    c, s = args["channels"], args["image_size"]
    in_flight = MAX_IMAGE_BYTES + MAX_IMAGE_PIXELS * c
    return DataShape((c, s, s), args["num_classes"], in_flight)


def webdataset_rules(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Arguments that do not fit one another, or keys that are not file extensions."""
    problems = []
    if args["val_pattern"] and args["val_fraction"]:
        problems.append(("val_fraction", "give val_pattern or val_fraction, not both"))
    for arg in ("image_key", "label_key"):
        keys = keys_of(args[arg])
        if len(keys) > 8 or not all(_KEY.fullmatch(k) for k in keys):
            problems.append(
                (arg, "up to 8 extensions separated by ';', each of letters, digits, _ . and -")
            )
    if not problems and set(keys_of(args["image_key"])) & set(keys_of(args["label_key"])):
        problems.append(("label_key", "must differ from the image_key extensions"))
    return problems
