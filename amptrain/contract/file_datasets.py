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

from amptrain.contract.registration import REQUIRED, Arg, Registration

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
    # image-folder. No footprint: the sample shape follows from the args, (channels,
    # image_size, image_size), but the classes are the folder's own, known only once the
    # worker has listed it; the built dataset's resident_bytes (its index) is checked then.
    _dataset(
        "image-folder",
        "amptrain.components.image_folder:build_image_folder",
        "One folder of JPEG/PNG/WebP images per class under a data root: path/train/<class>/ "
        "(and path/val/<class>/, the held-out split), or path/<class>/ with val_fraction held "
        "out. Labels are the class folders' names, sorted. Decoded by torchvision; training "
        "images get a random-resized crop (scale min_crop_scale to 1) and a horizontal flip, "
        "held-out ones a resize to image_size/0.875 and a centre crop; normalised (ImageNet "
        "mean and std for RGB). Symlinks, FIFOs and devices in the folder are never read; "
        "files over 64 MiB or 50 megapixels are bad files (on_corrupt).",
        Arg(
            "path",
            REQUIRED,
            "Folder path (relative to a data root, or absolute); local data roots only.",
            type="str",
        ),
        Arg(
            "image_size",
            224,
            "Side of the square images served, in pixels.",
            minimum=8,
            maximum=1024,
        ),
        Arg("channels", 3, "3 = RGB, 1 = grey (images are converted).", choices=(1, 3)),
        Arg(
            "min_crop_scale",
            0.08,
            "Smallest share of an image's area a training crop keeps (the lower end of "
            "torchvision's RandomResizedCrop scale; the upper is 1). Tiny images want more.",
            minimum=0.01,
            maximum=1.0,
        ),
        VAL_FRACTION,
        Arg(
            "max_files",
            2_000_000,
            "Most entries (files and folders) the folder may hold; listing stops with an error "
            "past it.",
            minimum=1,
            maximum=MAX_FILES,
        ),
        ON_CORRUPT,
        MAX_SKIPPED,
        provides="images",
        requires=("torchvision", "PIL"),
    ),
    # parquet
    # token-file
    # webdataset
)
