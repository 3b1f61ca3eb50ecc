"""The ``synthetic-images`` dataset: class patterns (smooth random fields), shifted at random,
plus noise; every sample made from its index, on the host or on a training device.

``fill`` may run in several threads at once, on disjoint parts of a batch: it uses NumPy for
the bulk work, which releases the GIL and never starts a thread team of its own (torch's
intra-op threads, one team per calling thread, would oversubscribe the cores several times
over and stall training).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from amptrain.components.base import DataInfo
from amptrain.components.held_out import IndexRange
from amptrain.components.sampling import BufferPool, below, generator, index_draws

Taps = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""Bilinear taps along one axis: first and second source index, and their weights."""
Term = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""One field's values at the first column taps, their weights, at the second, theirs."""


def _taps(source: int, size: int) -> Taps:
    """The taps of ``F.interpolate(mode="bilinear", align_corners=False)`` from ``source``
    pixels to ``size``."""
    at = ((torch.arange(size, dtype=torch.float64) + 0.5) * (source / size) - 0.5).clamp(min=0)
    first = at.floor().long().clamp(max=source - 1)
    frac = at - first
    return first, (first + 1).clamp(max=source - 1), (1 - frac).float(), frac.float()


def _matrix(taps: Taps, source: int) -> torch.Tensor:
    """The taps as a (size, source) interpolation matrix, in fp64."""
    first, second, w_first, w_second = taps
    m = torch.zeros(len(first), source, dtype=torch.float64)
    rows = torch.arange(len(first))
    m.index_put_((rows, first), w_first.double(), accumulate=True)
    m.index_put_((rows, second), w_second.double(), accumulate=True)
    return m


def _moments(
    fields: tuple[torch.Tensor, torch.Tensor],
    row_taps: tuple[Taps, Taps],
    col_taps: tuple[Taps, Taps],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class pattern's mean and (unbiased) standard deviation, from the fields and the
    interpolation matrices alone (a pattern channel is the sum over the fields of
    ``Wy @ field @ Wx.T``): a few small fp64 products instead of a pass over every pixel."""
    mats = [
        (f.double(), _matrix(ty, f.shape[2]), _matrix(tx, f.shape[3]))
        for f, ty, tx in zip(fields, row_taps, col_taps, strict=True)
    ]
    total = torch.zeros(fields[0].shape[0], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for fa, ya, xa in mats:
        total += torch.einsum("kcij,i,j->k", fa, ya.sum(0), xa.sum(0))
        for fb, yb, xb in mats:
            squares += torch.einsum("kcij,ip,jq,kcpq->k", fa, ya.T @ yb, xa.T @ xb, fb)
    n = fields[0].shape[1] * len(row_taps[0][0]) * len(col_taps[0][0])
    mean = total / n
    std = ((squares - n * mean**2) / (n - 1)).sqrt()
    return mean.float(), std.float()


def _rows(field: torch.Tensor, taps: Taps) -> torch.Tensor:
    """A (classes, channels, rows, columns) low-resolution field interpolated along its rows
    only: (classes, channels, height, columns)."""
    first, second, w_first, w_second = taps
    return field[:, :, first] * w_first[:, None] + field[:, :, second] * w_second[:, None]


class _Tables:
    """What a class pattern is computed from, at any pixel, on one device (a few MiB).

    A pattern is two smooth fields (4x4 and 8x8 noise) upsampled bilinearly and normalised
    per class (:func:`_moments`). The upsampling is separable: the fields are interpolated along the rows once
    (``rows``: classes x channels x height x 4 or 8), and along the columns where a pixel is
    asked for (``cols``: the taps). The host's whole patterns (:meth:`grid`) and the device's
    shifted ones (:meth:`at`) gather the same values and combine them with the same
    operations in the same order (:meth:`_combine`), so they are equal to the bit.
    """

    def __init__(
        self,
        rows: tuple[torch.Tensor, torch.Tensor],
        cols: tuple[Taps, Taps],
        stats: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        self.rows, self.cols, self.stats = rows, cols, stats

    def to(self, device: torch.device) -> _Tables:
        def move(taps: Taps) -> Taps:
            first, second, w_first, w_second = (t.to(device) for t in taps)
            return first, second, w_first, w_second

        return _Tables(
            (self.rows[0].to(device), self.rows[1].to(device)),
            (move(self.cols[0]), move(self.cols[1])),
            (self.stats[0].to(device), self.stats[1].to(device)),
        )

    def grid(self, classes: torch.Tensor) -> torch.Tensor:
        """Whole unshifted patterns of ``classes``: (len(classes), channels, height, width)."""
        terms: list[Term] = []
        for rows, (first, second, w_first, w_second) in zip(self.rows, self.cols, strict=True):
            picked = rows[classes]
            terms.append((picked[..., first], w_first, picked[..., second], w_second))
        return self._combine(terms, classes[:, None, None, None])

    def at(
        self, labels: torch.Tensor, ch: torch.Tensor, ys: torch.Tensor, xs: torch.Tensor
    ) -> torch.Tensor:
        """Pattern values at ``[labels, ch, ys, xs]``: index tensors broadcast together, the
        result in their broadcast shape (``labels`` broadcast to it for the statistics)."""
        terms = [
            (
                rows[labels, ch, ys, first[xs]],
                w_first[xs],
                rows[labels, ch, ys, second[xs]],
                w_second[xs],
            )
            for rows, (first, second, w_first, w_second) in zip(self.rows, self.cols, strict=True)
        ]
        return self._combine(terms, labels)

    def _combine(self, terms: list[Term], labels: torch.Tensor) -> torch.Tensor:
        """Each field's two column taps weighted and summed, the fields summed, normalised."""
        out: torch.Tensor | None = None
        for first, w_first, second, w_second in terms:
            term = first.mul_(w_first).add_(second.mul_(w_second))
            out = term if out is None else out.add_(term)
        assert out is not None
        mean, std = self.stats
        return out.sub_(mean[labels]).div_(std[labels])


class SyntheticImages:
    """Every sample made from its index: a class pattern, shifted at random, plus noise.

    The patterns are smooth random fields (low-resolution noise upsampled), one per
    class, so a CNN must recognise local texture wherever the shift put it. A shift wraps
    around (``torch.roll``); the noise is a crop, at a random offset, of one field of a
    fixed bank of Gaussian fields. A sample's label, shift, noise field and noise offset
    come from :func:`~amptrain.components.sampling.index_draws`: a whole batch is drawn
    in a few tensor ops, and a sample is the same whatever batch it is drawn in.

    :meth:`batch` (torch, in the calling thread) and :meth:`fill` (NumPy, in builder threads)
    build on the host: one add per image of a noise crop and a pattern crop, from the full
    patterns kept wrap-padded by the largest shift (so a shifted pattern is a crop; made on
    first use). :meth:`batch_on` builds on a training device without them: the
    patterns are computed there at each sample's shifted pixels from a few MiB of tables
    (:class:`_Tables`), gathered straight into channels_last (what tensor-core convolutions
    read), so a GPU never waits for the host and keeps no copy of the patterns (1000 classes
    of 3x224x224 would be 900 MiB). Both paths give the same values, to the bit.
    """

    def __init__(
        self,
        *,
        seed: int,
        channels: int,
        height: int,
        width: int,
        classes: int,
        noise: float,
        data_seed: int,
    ):
        self.info = DataInfo("classification", (channels, height, width), classes)
        self.seed = seed
        self.data_seed = data_seed
        self.noise = noise
        self.max_shift = (max(1, height // 8), max(1, width // 8))
        g = generator(data_seed, 0x1A6E)
        coarse = torch.randn(classes, channels, 4, 4, generator=g)
        fine = torch.randn(classes, channels, 8, 8, generator=g) * 0.5
        row_taps, col_taps = (
            (_taps(4, height), _taps(8, height)),
            (_taps(4, width), _taps(8, width)),
        )
        self._tables = _Tables(
            (_rows(coarse, row_taps[0]), _rows(fine, row_taps[1])),
            col_taps,
            _moments((coarse, fine), row_taps, col_taps),
        )
        my, mx = self.max_shift
        field = (channels, height + 2 * my, width + 2 * mx)
        # Many fields for small images, a few for large ones: about 16 MiB of noise, kept
        # already scaled by ``noise``: an image is then one add of two crops, on either path.
        fields = max(8, min(256, 2**22 // math.prod(field)))
        self.bank = torch.randn(fields, *field, generator=generator(data_seed, 0xB4A7))
        self.bank.mul_(noise)
        self._padded: torch.Tensor | None = None
        self._padded_lock = threading.Lock()
        self._resident: dict[torch.device, tuple[_Tables, torch.Tensor]] = {}
        self._buffers = BufferPool()

    # -- the patterns ---------------------------------------------------------------------------

    def _class_chunks(self) -> list[torch.Tensor]:
        per = max(1, 2**24 // math.prod(self.info.input_shape))  # ~64 MiB of fp32 at a time
        return list(torch.arange(self.info.num_classes).split(per))

    def _host_patterns(self) -> torch.Tensor:
        """The full patterns, wrap-padded by the largest shift (made once, on first use)."""
        with self._padded_lock:
            if self._padded is None:
                c, h, w = self.info.input_shape
                my, mx = self.max_shift
                padded = torch.empty(self.info.num_classes, c, h + 2 * my, w + 2 * mx)
                for k in self._class_chunks():
                    padded[k] = _wrap_pad(self._tables.grid(k), my, mx)
                self._padded = padded
            return self._padded

    # -- the host path ----------------------------------------------------------------------------

    def _draws(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Per sample: label, pattern offset (y, x), noise field, noise offset (y, x)."""
        my, mx = self.max_shift
        d = index_draws(indices, 6, self.seed, self.data_seed, 0x1A6E5)
        limits = (
            self.info.num_classes,
            2 * my + 1,
            2 * mx + 1,
            len(self.bank),
            2 * my + 1,
            2 * mx + 1,
        )
        return [below(d[:, i], n) for i, n in enumerate(limits)]

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch built in the calling thread (torch ops: intra-op threads help here)."""
        c, h, w = self.info.input_shape
        images = self._buffers.empty(size, c, h, w)
        labels, crops = self._crops(start, size)
        for j, (pattern, noise) in enumerate(crops):
            if noise is None:
                images[j].copy_(pattern)
            else:
                torch.add(noise, pattern, out=images[j])
        return images, labels

    def held_out(self) -> IndexRange:
        """Stream indices from ``HELD_OUT_START`` on: the same generator, never trained on."""
        return IndexRange(self)

    def fill(self, start: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """:meth:`batch` written into ``inputs`` (N, C, H, W) and ``targets``, by NumPy (no
        thread team per calling thread: several threads may fill parts of a batch at once).
        The same single add per pixel, so the same bits."""
        labels, crops = self._crops(start, len(inputs))
        targets.copy_(labels)
        out = inputs.numpy()
        for j, (pattern, noise) in enumerate(crops):
            if noise is None:
                np.copyto(out[j], pattern.numpy())
            else:
                np.add(noise.numpy(), pattern.numpy(), out=out[j])

    def _crops(
        self, start: int, size: int
    ) -> tuple[torch.Tensor, Iterator[tuple[torch.Tensor, torch.Tensor | None]]]:
        """Labels of samples ``[start, start + size)`` and, per sample, its pattern crop and
        its (scaled) noise crop (None without noise): views, nothing copied."""
        _, h, w = self.info.input_shape
        labels, *offsets = self._draws(torch.arange(start, start + size))
        padded = self._host_patterns()
        rows = zip(labels.tolist(), *(o.tolist() for o in offsets), strict=True)
        crops = (
            (
                padded[label, :, oy : oy + h, ox : ox + w],
                self.bank[field, :, ny : ny + h, nx : nx + w] if self.noise else None,
            )
            for label, oy, ox, field, ny, nx in rows
        )
        return labels, crops

    # -- the device path ------------------------------------------------------------------------

    def batch_on(
        self, start: int, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`batch`, built on ``device`` (its tables and the noise bank are copied there
        once); on CUDA the images are channels_last."""
        if device.type == "cpu":
            return self.batch(start, size)
        return self.gathered(start, size, device)

    def gathered(
        self, start: int, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The device path: the same samples as :meth:`batch`, by indexing instead of a loop,
        laid out channels_last: (N, C, H, W) over (N, H, W, C) memory."""
        tables, bank = self._on(device)
        c, h, w = self.info.input_shape
        my, mx = self.max_shift
        labels, oy, ox, field, ny, nx = self._draws(
            torch.arange(start, start + size, device=device)
        )
        ch = torch.arange(c, device=device)[None, None, None, :]
        ys = torch.arange(h, device=device)
        xs = torch.arange(w, device=device)
        which = labels[:, None, None, None]
        # A shift wraps around: pixel (y, x) shows the pattern at (y + oy - my, x + ox - mx).
        images = tables.at(
            which,
            ch,
            ((ys[None, :] + (oy - my)[:, None]) % h)[:, :, None, None],
            ((xs[None, :] + (ox - mx)[:, None]) % w)[:, None, :, None],
        )
        if self.noise:
            noise = bank[
                field[:, None, None, None],
                ch,
                (ny[:, None] + ys)[:, :, None, None],
                (nx[:, None] + xs)[:, None, :, None],
            ]
            images.add_(noise)
        return images.permute(0, 3, 1, 2), labels

    def _on(self, device: torch.device) -> tuple[_Tables, torch.Tensor]:
        if device not in self._resident:
            self._resident[device] = (self._tables.to(device), self.bank.to(device))
        return self._resident[device]


def _wrap_pad(x: torch.Tensor, my: int, mx: int) -> torch.Tensor:
    """Pad the last two dims by wrapping around, so a crop at ``(my - sy, mx - sx)`` equals
    ``torch.roll(x, (sy, sx), dims=(-2, -1))``."""
    x = torch.cat([x[..., -my:, :], x, x[..., :my, :]], dim=-2)
    return torch.cat([x[..., -mx:], x, x[..., :mx]], dim=-1).contiguous()


def build_synthetic_images(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    channels: int = 3,
    height: int = 32,
    width: int = 32,
    classes: int = 10,
    noise: float = 0.5,
    data_seed: int = 0,
) -> SyntheticImages:
    return SyntheticImages(
        seed=seed,
        channels=channels,
        height=height,
        width=width,
        classes=classes,
        noise=noise,
        data_seed=data_seed,
    )
