"""Apply the Alembic migrations in ``amptrain/migrations/`` programmatically.

The schema comes only from those migrations (``amptrain db upgrade`` and the
start-up of ``amptrain up`` call :func:`upgrade`); nothing calls ``create_all``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from amptrain.store.db import make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def _run(url: str, fn: str, revision: str) -> None:
    cfg = _config()
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            getattr(command, fn)(cfg, revision)
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (default: the newest)."""
    _run(url, "upgrade", revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` drops everything)."""
    _run(url, "downgrade", revision)


def current_revision(url: str) -> str | None:
    """The revision the database is at, or None for an empty database."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """The newest revision in ``amptrain/migrations/versions``."""
    return ScriptDirectory.from_config(_config()).get_current_head()
