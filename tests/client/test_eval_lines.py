"""How the command lines show an evaluation: one short line, and the newest accuracy kept
in the progress stats, within 80 columns (no server needed)."""

from __future__ import annotations

import functools

from amptrain.client.event_lines import eval_headline, eval_line, layer_norms_line, with_headline
from amptrain.client.progress_bar import short as _short
from amptrain.client.progress_bar import stats_room as _stats_room
from amptrain.contract.progress import progress_line


def test_an_evaluation_is_one_short_line_accuracy_first() -> None:
    data = {"step": 1200, "values": {"eval_loss": 0.2134, "accuracy": 0.93, "top5_accuracy": 1.0}}
    assert eval_line(data) == "eval step 1200 · acc 0.93 · top5 1 · eval loss 0.2134"
    # Narrow: the last values go first, the step and the first value stay.
    assert eval_line(data, width=30) == "eval step 1200 · acc 0.93"
    # A plugin's metric shows under its own name; a non-finite value as n/a.
    plugin = {"step": 5, "values": {"bleu_score": 31.5, "eval_loss": None}}
    assert eval_line(plugin) == "eval step 5 · eval loss n/a · bleu_score 31.5"
    assert eval_headline(plugin["values"]) == "bleu_score 31.5"
    assert eval_headline(data["values"]) == "acc 0.93"
    assert eval_headline({"accuracy": None}) is None


def test_a_steps_layer_norms_are_one_line_of_their_extremes_within_the_width() -> None:
    long = "encoder.blocks.11.attention.output_projection"
    data = {"step": 30, "values": {"net.1": 0.012, long: 0.8, "net.8": None}}
    assert layer_norms_line(data) == (
        f"layer grad norms step 30 · 3 layers · max {long} 0.8 · min net.1 0.012"
    )
    # Narrow: the minimum goes first, then the maximum; the step and the count stay.
    assert layer_norms_line(data, width=100).endswith(f"· max {long} 0.8")
    assert layer_norms_line(data, width=80) == "layer grad norms step 30 · 3 layers"
    assert layer_norms_line({"step": 2, "values": {"net.1": None}}, width=80).endswith("n/a")


def test_the_progress_stats_keep_the_newest_accuracy_within_80_columns() -> None:
    point = {
        "loss": 0.123456,
        "loss_scale": 65536.0,
        "skipped_steps": 3,
        "memory_peak": 512 * 2**20,
        "samples_per_second": 12345.0,
    }
    stats = functools.partial(progress_line, point)
    room = _stats_room(80, _short("resnet-cifar"), 5000)
    line = with_headline(stats, "acc 0.93", room)
    assert line == "loss 0.1235 · acc 0.93" and len(line) <= room
    wide = _stats_room(160, "resnet-cifar", 5000)
    assert with_headline(stats, "acc 0.93", wide) == f"{stats(None)} · acc 0.93"
    assert with_headline(stats, None, room) == stats(room)
    # No room for both (a long name, a million steps, 80 columns): the step fields stay.
    tight = _stats_room(80, _short("a-long-job-name-for-the-test"), 1_000_000)
    assert with_headline(stats, "acc 0.93", tight) == stats(tight)
