"""The engine tests' read modes: telemetry reading at once (a CPU, several GPUs) and one
flush late (one GPU), emulated on the CPU by ``Trainer.read_later``. Modules whose guardian,
rollback, fallback, divergence and evaluation tests must hold in both mark themselves
``pytestmark = pytest.mark.usefixtures("read_mode")``."""

from __future__ import annotations

import pytest

from amptrain.engine import Trainer


@pytest.fixture(params=["at_once", "one_flush_late"])
def read_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(Trainer, "read_later", request.param == "one_flush_late")
    return str(request.param)
