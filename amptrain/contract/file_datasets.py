"""Datasets read from files on disk: image folders, Parquet/Arrow tables, token files and
tar shards (the catalog entries; the readers are in ``amptrain.components``).

Every one follows the rules of ``tensors`` (:mod:`amptrain.contract.data_access`): a path
is checked as text against the data roots at submit time and again by the worker, which
opens each file beneath a root without following a symlink, regular files only, with
file counts and sizes bounded. A sample's content depends only on the job's seed, the
epoch and the sample's index, so resume, micro-batch halving and data-parallel ranks are
exact. What each holds in memory (an index, a shuffle window), not its size on disk, is
what admission counts.
"""

from __future__ import annotations

from typing import Any

from amptrain.contract.registration import Arg, Registration

MAX_FILES = 10_000_000
"""Files one dataset may list or name (a folder listing stops, with an error, past it)."""


def _dataset(name: str, builder: str, description: str, *args: Arg, **kw: Any) -> Registration:
    return Registration(name, "dataset", builder, description, args, **kw)


ON_CORRUPT = Arg(
    "on_corrupt",
    "fail",
    "A file or record that does not decode: 'fail' stops the job naming its path; 'skip' "
    "uses the next sample in its place (the same one on every run) and counts it in a "
    "data_skipped event.",
    choices=("fail", "skip"),
)
MAX_SKIPPED = Arg(
    "max_skipped",
    100,
    "With on_corrupt 'skip': past this many distinct bad files the job fails anyway.",
    minimum=0,
    maximum=1_000_000,
)
VAL_FRACTION = Arg(
    "val_fraction",
    0.0,
    "Fraction held out for evaluation when there is no separate held-out split, drawn by "
    "a seed fixed per dataset (the same for every job) and never trained on; 0 = none.",
    minimum=0,
    maximum=0.5,
)

FILE_DATASETS: tuple[Registration, ...] = (
    # image-folder
    # parquet
    # token-file
    # webdataset
)
