"""``amptrain fork --set``: dotted paths into nested overrides, JSON values or text."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from amptrain.client.fork_command import overrides_of


def test_sets_nest_and_merge_over_the_file(tmp_path: Path) -> None:
    file = tmp_path / "o.yaml"
    file.write_text("optimizer: {lr: 0.1, weight_decay: 0.01}\nprecision: fp32\n")
    sets = ("optimizer.lr=0.0005", "precision=bf16", "eval.at_end=false", "max_steps=40")
    assert overrides_of(sets, file) == {
        "optimizer": {"lr": 0.0005, "weight_decay": 0.01},
        "precision": "bf16",
        "eval": {"at_end": False},
        "max_steps": 40,
    }


@pytest.mark.parametrize("bad", ["optimizer.lr", "=1", "a..b=1", "a.b.c.d.e=1"])
def test_a_malformed_set_is_refused(bad: str) -> None:
    with pytest.raises(click.BadParameter):
        overrides_of((bad,), None)
