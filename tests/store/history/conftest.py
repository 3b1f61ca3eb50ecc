"""The metric-history tests' database: migrated to head, as an engine (for writing points
without summaries, as a script would) and a session factory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store.db import make_engine, make_session_factory
from tests.support.databases import migrated


@pytest.fixture
def db(database_url: str) -> Iterator[tuple[sa.Engine, sessionmaker[Session]]]:
    migrated(database_url)
    engine = make_engine(database_url)
    yield engine, make_session_factory(engine)
    engine.dispose()
