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

from collections.abc import Mapping
from typing import Any

from amptrain.contract.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from amptrain.contract.registration import REQUIRED, Arg, Registration
from amptrain.contract.sizing import DataShape
from amptrain.contract.tar_shards import webdataset_footprint, webdataset_rules

MAX_FILES = 10_000_000
"""Files one dataset may list or name (a folder listing stops, with an error, past it)."""
_IMAGE_BOUNDS = f"{MAX_IMAGE_BYTES >> 20} MiB or {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels"


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
MIN_CROP_SCALE = Arg(
    "min_crop_scale",
    0.08,
    "Smallest share of an image's area a training crop keeps (the lower end of "
    "torchvision's RandomResizedCrop scale, 0.08 as for ImageNet; the upper is 1). Tiny "
    "images want more.",
    minimum=0.01,
    maximum=1.0,
)
VAL_FRACTION = Arg(
    "val_fraction",
    0.0,
    "Fraction held out for evaluation when there is no separate held-out split, drawn by "
    "a seed fixed per dataset (the same for every job) and never trained on; 0 = none.",
    minimum=0,
    maximum=0.5,
)

SEQ_LEN = Arg(
    "seq_len", 256, "Tokens per sample (model context length).", minimum=1, maximum=65_536
)
VOCAB_SIZE = Arg(
    "vocab_size",
    REQUIRED,
    "Vocabulary size: every token id read must be below it (256 for bytes).",
    type="int",
    minimum=2,
    maximum=1_048_576,
)
TOKEN_WIDTHS = {"uint16": 2, "uint32": 4}
TOKEN_WINDOW_BLOCKS = 256
"""Blocks a token dataset's footprint counts as its prefetch window (the gathered ids, then
int64 inputs and targets); its block order is added by the built dataset."""


def _token_file_footprint(args: Mapping[str, Any]) -> DataShape:
    """A window of blocks, not the file (mapped: its pages are the page cache's)."""
    t = args["seq_len"]
    window = TOKEN_WINDOW_BLOCKS * (t + 1) * (TOKEN_WIDTHS[args["dtype"]] + 3 * 8)
    return DataShape((t,), args["vocab_size"], window)


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
        "mean and std for RGB, 0.5 and 0.5 for grey). Symlinks, FIFOs and devices in the "
        f"folder are never read; files over {_IMAGE_BOUNDS} are bad files (on_corrupt).",
        Arg(
            "path",
            REQUIRED,
            "Folder path (relative to a data root, or absolute); local data roots only.",
            type="str",
            path=True,
        ),
        Arg(
            "image_size",
            224,
            "Side of the square images served, in pixels.",
            minimum=8,
            maximum=1024,
        ),
        Arg("channels", 3, "3 = RGB, 1 = grey (images are converted).", choices=(1, 3)),
        MIN_CROP_SCALE,
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
    _dataset(
        "parquet",
        "amptrain.components.parquet_dataset:build_parquet",
        "Named columns of a Parquet file (.parquet), an Arrow IPC file or stream (.arrow), "
        "or a folder written by Hugging Face datasets' save_to_disk (anything else), read "
        "a row group at a time or memory-mapped, never loaded whole. classification: "
        "input_column holds encoded images (decoded; training rows get a random-resized crop "
        "(min_crop_scale to 1) and a flip, held-out ones the shorter side resized to "
        f"image_size/0.875 and centre-cropped; over {_IMAGE_BOUNDS}: bad rows) or text "
        "(tokenized, truncated and padded to seq_len), label_column integer labels; each "
        "epoch visits the row groups in a seeded order and their rows in a seeded order. "
        "language_model: input_column's text, tokenized and concatenated into one token "
        "stream held in memory, cut into blocks of seq_len + 1.",
        Arg(
            "path",
            REQUIRED,
            "Table file or save_to_disk folder under a data root.",
            type="str",
            path=True,
        ),
        Arg(
            "task",
            "classification",
            "What the columns hold.",
            choices=("classification", "language_model"),
        ),
        Arg("input_column", "image", "Column of image bytes or text.", max_length=200),
        Arg("label_column", "label", "Column of integer labels (classification).", max_length=200),
        Arg(
            "num_classes",
            0,
            "Classes; 0 = the largest label + 1 (one column read).",
            minimum=0,
            maximum=10_000_000,
        ),
        Arg(
            "image_size",
            224,
            "Side of the square images served, in pixels.",
            minimum=4,
            maximum=4096,
        ),
        MIN_CROP_SCALE,
        SEQ_LEN,
        Arg(
            "tokenizer_path",
            "",
            "A tokenizer.json (the tokenizers library's) under a data root; empty = UTF-8 "
            "bytes (vocabulary 256).",
            type="str",
            path=True,
        ),
        Arg(
            "val_path",
            "",
            "Held-out table of the same layout and columns; empty = none, or val_fraction.",
            type="str",
            path=True,
        ),
        Arg(
            "val_fraction",
            0.0,
            "Held out: classification, rows drawn by a seed fixed per table; language_model, "
            "the last blocks of the stream. 0 = none (or val_path).",
            minimum=0,
            maximum=0.5,
        ),
        ON_CORRUPT,
        MAX_SKIPPED,
        requires=("pyarrow", "tokenizers"),
    ),
    # token-file
    _dataset(
        "token-file",
        "amptrain.components.token_file:build_token_file",
        "A tokenized corpus as one flat binary file of token ids (nanoGPT's train.bin: "
        "uint16 or uint32 little-endian, no header), memory-mapped and cut into "
        "non-overlapping blocks of seq_len + 1 tokens, visited in a seeded order every "
        "epoch; targets are the next tokens. Held out: val_path, or the last val_fraction "
        "of the blocks.",
        Arg(
            "path",
            REQUIRED,
            "Token file under a data root (relative or absolute).",
            type="str",
            path=True,
        ),
        Arg(
            "dtype", "uint16", "Width of a token id (little-endian).", choices=("uint16", "uint32")
        ),
        SEQ_LEN,
        VOCAB_SIZE,
        Arg(
            "val_path",
            "",
            "Held-out token file (e.g. other source documents), checked like path; empty = "
            "none, or val_fraction.",
            type="str",
            path=True,
        ),
        Arg(
            "val_fraction",
            0.0,
            "Fraction of path's blocks held out: the last ones (a contiguous tail, so no "
            "held-out block sits between training text); 0 = none (or val_path).",
            minimum=0,
            maximum=0.5,
        ),
        ON_CORRUPT,
        MAX_SKIPPED,
        provides="tokens",
        footprint=_token_file_footprint,
    ),
    # webdataset
    _dataset(
        "webdataset",
        "amptrain.components.webdataset:build_webdataset",
        "Images and integer labels from tar shards in the WebDataset format (a sample is the "
        "consecutive members sharing a name up to the first dot: 000123.jpg + 000123.cls), "
        "listed by a brace pattern (shards/train-{000000..000099}.tar) under the data roots, "
        "for data larger than the machine: only the tar headers are read to index the "
        "samples; each epoch visits the shards in a seeded order, the samples of a shard "
        "shuffled within a window; images are read one member at a time. Train: "
        "random-resized crop (scale min_crop_scale to 1) + flip; evaluation: resize to "
        "image_size/0.875 + centre crop; ImageNet mean and std (grey: 0.5 and 0.5). Members "
        f"over {_IMAGE_BOUNDS} are bad (on_corrupt).",
        Arg(
            "pattern",
            REQUIRED,
            "Shard paths as a brace pattern (relative to a data root, or absolute inside "
            "one), uncompressed .tar files.",
            type="str",
            path=True,
        ),
        Arg(
            "val_pattern",
            "",
            "Held-out shards (a brace pattern, read in the listed order); empty = none, or "
            "val_fraction of the shards.",
            type="str",
            path=True,
        ),
        VAL_FRACTION,
        Arg(
            "image_key",
            "jpg;jpeg;png;webp",
            "Extensions of the image member, ';'-separated: the first a sample has is used.",
            max_length=200,
        ),
        Arg(
            "label_key", "cls", "Extension of the label member (an ASCII integer).", max_length=200
        ),
        Arg("image_size", 224, "Side of the square images served.", minimum=8, maximum=1024),
        Arg("channels", 3, "1 (grey) or 3 (RGB).", choices=(1, 3)),
        Arg(
            "num_classes",
            0,
            "Classes; a label must be below it. 0 = the largest label in the shards + 1.",
            minimum=0,
            maximum=10_000_000,
        ),
        MIN_CROP_SCALE,
        Arg(
            "shuffle_window",
            1000,
            "Samples of a shard are shuffled within consecutive windows of this many (1 = "
            "in stored order): reads stay close together in the file.",
            minimum=1,
            maximum=1_000_000,
        ),
        Arg(
            "max_shards",
            10_000,
            "Most shards a pattern may name (each pattern; refused before expanding).",
            minimum=1,
            maximum=MAX_FILES,
        ),
        ON_CORRUPT,
        MAX_SKIPPED,
        provides="images",
        requires=("torchvision", "braceexpand"),
        footprint=webdataset_footprint,
        rules=webdataset_rules,
    ),
)
