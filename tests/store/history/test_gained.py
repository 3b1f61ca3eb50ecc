"""What an appending part gained (:class:`~amptrain.store.history.gained.Appended`) answers
every reader as the dict of its steps did: membership, lookups, values, items, order and
equality, for consecutive steps and steps with gaps."""

from __future__ import annotations

import math

import pytest

from amptrain.store.history.gained import Appended


@pytest.mark.parametrize("steps", [[3, 4, 5, 6], [3, 5, 9, 200], [7]])
def test_an_appended_part_reads_as_the_dict_of_its_steps(steps: list[int]) -> None:
    values = [1.0, None, math.inf, -0.0][: len(steps)]
    got, want = Appended(steps, values), dict(zip(steps, values, strict=True))
    assert got == want and want == got
    assert len(got) == len(want) and list(got) == list(want)
    assert list(got.items()) == list(want.items())
    assert list(got.values()) == list(want.values())
    assert (None in got.values()) == (None in want.values())
    assert (2.5 in got.values()) is False
    for step in [*range(-1, 260), None, "3", 3.5]:
        assert (step in got) == (step in want), step
        assert got.get(step, "absent") == want.get(step, "absent"), step  # type: ignore[arg-type]
        if step in want:
            assert got[step] == want[step]  # type: ignore[index]
        else:
            with pytest.raises(KeyError):
                got[step]  # type: ignore[index]
