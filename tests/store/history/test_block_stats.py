"""A chunk's step series aggregated as one block give exactly the per-series aggregates
(:func:`~amptrain.store.history.rollups.gained_stats`): nulls, NaN, infinities, ties, -0.0
beside 0.0, bools and ints, a series all null; and a part that did not gain whole, or
whose steps do not rise, or that holds a value that is not a number, is left to the
per-series route."""

from __future__ import annotations

import math
import random
from array import array
from typing import Any

from amptrain.store.history.block_stats import gained_blocks, part_blocks
from amptrain.store.history.chunk_merge import value_range
from amptrain.store.history.chunk_parts import STEP_KIND, Key, Part, rolled_up
from amptrain.store.history.rollups import Stats, gained_stats

ODD: list[Any] = [None, math.nan, math.inf, -math.inf, 0.0, -0.0, 1, True, False, 2.5, -7]


def _part(steps: list[int], values: list[Any]) -> Part:
    part = Part()
    part.steps, part.values, part.times = steps, values, [None] * len(steps)
    return part


def _series(rng: random.Random, n: int, kind: int) -> list[Any]:
    if kind == 0:
        return [None] * n  # a field the run does not record
    if kind == 1:
        return [rng.choice(ODD) for _ in range(n)]
    if kind == 2:
        return [float(rng.randint(-2, 2)) for _ in range(n)]  # many ties
    return [rng.random() for _ in range(n)]


def test_a_block_gives_the_per_series_aggregates() -> None:
    rng = random.Random(41)
    for trial in range(300):
        n = rng.randint(1, 40)
        steps = sorted(rng.sample(range(256 * 3, 256 * 4), n))
        parts: dict[Key, Part] = {}
        for i in range(8):
            key = ("j", STEP_KIND, f"f{i}", 3, 1)
            parts[key] = _part(steps, _series(rng, n, (trial + i) % 4))
        gains = {key: dict(zip(p.steps, p.values, strict=True)) for key, p in parts.items()}
        blocks = gained_blocks(gains, parts, part_blocks(parts, rolled_up))
        assert set(blocks) == set(parts)
        for key, row in blocks.items():
            assert repr(Stats(row).row()) == repr(gained_stats(gains[key], None).row()), key
            # the chunk row's span of the new values (its low, high, non_finite columns)
            got = array("d", [math.nan if v is None else v for v in parts[key].values])
            stats = Stats(row)
            assert repr((stats.low, stats.high, stats.non_finite)) == repr(value_range(got))


def test_what_is_not_a_whole_rising_block_of_numbers_goes_per_series() -> None:
    steps = [5, 6, 9]
    shared = {
        ("j", STEP_KIND, "a", 0, 1): _part(steps, [1.0, 2.0, 3.0]),
        ("j", STEP_KIND, "b", 0, 1): _part(steps, [1.0, "2.0", 3.0]),  # a str: null per series
        ("j", STEP_KIND, "c", 0, 1): _part(steps, [1.0, 10**400, 3.0]),
        ("j", STEP_KIND, "@ms", 0, 1): _part(steps, [1.0, 2.0, 3.0]),  # keeps no roll-ups
    }
    falling = [9, 6, 5]
    apart = {
        ("j", STEP_KIND, "d", 1, 1): _part(falling, [1.0, 2.0, 3.0]),
        ("j", STEP_KIND, "e", 1, 1): _part(falling, [1.0, 2.0, 3.0]),
    }
    parts = {**shared, **apart}
    gains = {key: dict(zip(p.steps, p.values, strict=True)) for key, p in parts.items()}
    # "b" goes per series; "a" and "c" would be a block, but "c" holds an int beyond a double
    assert set(gained_blocks(gains, parts, part_blocks(parts, rolled_up))) == set()
    parts[("j", STEP_KIND, "c", 0, 1)] = _part(steps, [1.0, 2.0, 3.0])
    gains[("j", STEP_KIND, "c", 0, 1)] = {5: 1.0, 9: 3.0}  # gained in part (a replay)
    parts[("j", STEP_KIND, "f", 0, 1)] = _part(steps, [0.5, None, math.nan])
    gains[("j", STEP_KIND, "f", 0, 1)] = dict(zip(steps, [0.5, None, math.nan], strict=True))
    assert set(gained_blocks(gains, parts, part_blocks(parts, rolled_up))) == {
        ("j", STEP_KIND, "a", 0, 1),
        ("j", STEP_KIND, "f", 0, 1),
    }
