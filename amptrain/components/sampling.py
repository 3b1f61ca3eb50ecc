"""Deterministic randomness keyed by (seed, sample index).

Every dataset's ``batch(start, size)`` must be a pure function of its seed and
the sample indices, whatever the batch boundaries: resuming at sample 1000 or
splitting a batch of 64 into two of 32 must give the same samples. Two tools
make that cheap: a generator seeded from the index itself (for samples made on
the fly) and a per-epoch permutation of a fixed pool (for finite pools).
"""

from __future__ import annotations

import math

import torch

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from several integers (splitmix64 over the parts)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        x = z ^ (z >> 31)
    return x >> 1  # torch.Generator.manual_seed takes values below 2**63


def generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded from ``parts``."""
    return torch.Generator().manual_seed(mix_seed(*parts))


class EpochOrder:
    """Maps stream positions to rows of a pool of ``n`` samples, reshuffled every epoch.

    Position ``i`` is row ``perm(i // n)[i % n]``; each epoch's permutation is drawn
    from ``(seed, epoch)`` alone, so any position can be computed without the others.
    """

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("a pool needs at least one sample")
        self.n = n
        self.seed = seed
        self._cache: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        perm = self._cache.get(epoch)
        if perm is None:
            if len(self._cache) >= 4:  # a batch spans at most a few epochs; keep memory flat
                self._cache.pop(next(iter(self._cache)))
            perm = torch.randperm(self.n, generator=generator(self.seed, epoch, 0xE90C))
            self._cache[epoch] = perm
        return perm

    def rows(self, start: int, size: int) -> torch.Tensor:
        """Pool rows for positions ``[start, start + size)``."""
        if start < 0 or size < 0:
            raise ValueError("start and size must be non-negative")
        pieces = []
        pos = start
        end = start + size
        while pos < end:
            epoch, offset = divmod(pos, self.n)
            take = min(end - pos, self.n - offset)
            pieces.append(self._perm(epoch)[offset : offset + take])
            pos += take
        if not pieces:
            return torch.empty(0, dtype=torch.long)
        return torch.cat(pieces)


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in [0, 2**32), with no int64 overflow on the way."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (lowbias32) on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def index_draws(indices: torch.Tensor, n: int, *key: int) -> torch.Tensor:
    """``(len(indices), n)`` int64 values in [0, 2**32): column ``j`` of row ``i`` depends only on
    ``(key, indices[i], j)``.

    A counter-based generator: a whole batch's draws come from a few tensor ops on
    whatever device ``indices`` lives on (no Python loop, no generator per sample), and a
    sample's draws do not depend on the batch it is drawn in.
    """
    k = mix_seed(*key)
    idx = indices.to(torch.int64)
    h = _hash32((idx & _M32) ^ (k & _M32))
    h = _hash32(h ^ (idx >> 32) ^ ((k >> 32) & _M32))
    cols = (torch.arange(n, device=indices.device, dtype=torch.int64) * 0x9E3779B9) & _M32
    return _hash32(h[:, None] ^ cols[None, :])


def below(draws: torch.Tensor, n: int) -> torch.Tensor:
    """Map 32-bit draws to integers in [0, n) (``n`` < 2**31)."""
    return (draws * n) >> 32


class BufferPool:
    """Output buffers for batches, reused once nothing references them any more.

    A fresh multi-megabyte tensor is paid for in page faults on every batch (a 3x224x224
    batch of 256 is 154 MB: more time faulting it in than filling it). A buffer is reused
    only when its storage has no user left but this pool: no tensor, no view, no autograd
    graph that saved it. Used by one thread at a time (the engine's prefetch thread).
    """

    def __init__(self, keep: int = 6) -> None:
        self.keep = keep
        self._storages: list[torch.UntypedStorage] = []

    def empty(self, *shape: int) -> torch.Tensor:
        """A float32 tensor of ``shape`` with undefined contents."""
        nbytes = 4 * math.prod(shape)
        for storage in self._storages:
            if storage.nbytes() == nbytes and torch._C._storage_Use_Count(storage._cdata) == 1:
                strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
                return torch.empty(0).set_(storage, 0, shape, strides)
        fresh = torch.empty(*shape)
        if len(self._storages) < self.keep:
            self._storages.append(fresh.untyped_storage())
        return fresh
