"""The worker's file of ``precision: auto`` decisions: it outlives the process that wrote it."""

from __future__ import annotations

from pathlib import Path

from amptrain.worker.child import precision_cache
from amptrain.worker.child.precision_cache import FileCache
from amptrain.worker.child.protocol import PrecisionChosen


def test_a_decision_written_by_one_process_is_read_by_the_next(tmp_path: Path) -> None:
    path = tmp_path / "data" / "auto-precision.json"
    FileCache(path)["k"] = {"effective": "fp32"}
    assert FileCache(path)["k"] == {"effective": "fp32"} and len(FileCache(path)) == 1
    assert FileCache(path).get("other") is None


def test_an_unreadable_file_is_an_empty_cache_and_the_oldest_entries_go(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "auto-precision.json"
    path.write_text("{not json")
    cache = FileCache(path)
    assert len(cache) == 0 and cache.get("k") is None
    monkeypatch.setattr(precision_cache, "MAX_ENTRIES", 2)
    for key in ("a", "b", "c"):
        cache[key] = {"n": key}
    assert list(cache) == ["b", "c"]
    assert [p.name for p in tmp_path.iterdir()] == ["auto-precision.json"]  # no temporaries


def test_the_measurement_travels_with_the_precision_and_a_rule_keeps_the_old_shape() -> None:
    measured = PrecisionChosen(
        requested="auto", effective="fp32", reason="r", device="cpu", measurement={"ratio": 0.5}
    )
    assert measured.event_data()["measurement"] == {"ratio": 0.5}
    rule = PrecisionChosen(requested="auto", effective="fp32", reason="r", device="cpu")
    assert "measurement" not in rule.event_data()
