"""What a chunk gained from a batch (:data:`Gained`): the steps a write added, which the
roll-ups, the exemplars, the progress and the steady rate read
(:func:`amptrain.store.history.chunk_writes.write` returns them per chunk).
Standard library only: the recorder does without numpy.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from typing import Any

Gained = Mapping[int, Any]
"""The steps a chunk gained: step -> value as recorded (None = null); a dict, or the
part itself when it only appends (:class:`Appended`). No time: nothing reads it there,
and a tuple per value was a third of building these (and garbage collector work: a tuple
is tracked, a dict of numbers is not)."""


class Appended(Mapping[int, Any]):
    """What a part that only appends gained (:data:`Gained`): all of it, its steps rising,
    over the part's own lists. A dict of every new step for each of a batch's ~15 series
    was ~0.5 us a point, while its readers take the values whole (the roll-ups' flags) or
    look up a few steps (the cursor's, the exemplars' notable ones)."""

    __slots__ = ("_steps", "_values")

    def __init__(self, steps: list[int], values: list[Any]) -> None:
        self._steps = steps
        self._values = values

    def __len__(self) -> int:
        return len(self._steps)

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __contains__(self, step: object) -> bool:
        return self._at(step) >= 0

    def __getitem__(self, step: int) -> Any:
        i = self._at(step)
        if i < 0:
            raise KeyError(step)
        return self._values[i]

    def get(self, step: int, default: Any = None) -> Any:
        i = self._at(step)
        return self._values[i] if i >= 0 else default

    def _at(self, step: object) -> int:
        """The index of ``step`` (-1: not held): its offset from the first step when the
        steps are consecutive (nearly always), else a binary search."""
        steps = self._steps
        if type(step) is not int:
            return -1
        i = step - steps[0]
        if 0 <= i < len(steps) and steps[i] == step:
            return i
        i = bisect_left(steps, step)
        return i if i < len(steps) and steps[i] == step else -1

    def values(self) -> ValuesView[Any]:
        return _Values(self)

    def items(self) -> ItemsView[int, Any]:
        return _Items(self)


class _Values(ValuesView[Any]):
    _mapping: Appended

    def __iter__(self) -> Iterator[Any]:
        return iter(self._mapping._values)

    def __contains__(self, value: object) -> bool:
        return value in self._mapping._values


class _Items(ItemsView[int, Any]):
    _mapping: Appended

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return zip(self._mapping._steps, self._mapping._values, strict=True)
