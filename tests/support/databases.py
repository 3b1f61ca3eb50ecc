"""Test databases at the newest schema without replaying every migration for each test.

Each test process runs the migrations once per backend into a template (a SQLite file, a
PostgreSQL database) and gives every later empty test database a copy of it: a file copy,
or PostgreSQL's ``CREATE DATABASE ... TEMPLATE``. Replaying the 13 migrations cost about
0.7 s of SQLite commits and 1.5 s of PostgreSQL DDL per test; the copy costs a few
milliseconds and 0.2 s. The migrations themselves stay tested: every template is built by
``migrate.upgrade``, and tests/store/test_migrations.py walks them up and down.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa

from amptrain.store import migrate

_templates: dict[str, str] = {}
"""This process's migrated template per backend: a file path (SQLite), a database name."""


def migrated(database_url: str) -> None:
    """Bring the database at ``database_url`` to head: a copy of the template when it is
    empty (as the ``database_url`` fixture makes it), ``migrate.upgrade`` otherwise (a
    database a test already filled or migrated part way)."""
    url = sa.make_url(database_url)
    if not _is_empty(url):
        migrate.upgrade(database_url)
    elif url.get_backend_name() == "sqlite":
        shutil.copyfile(_sqlite_template(), str(url.database))
    elif url.get_backend_name() == "postgresql":
        _clone_postgresql(url)
    else:
        migrate.upgrade(database_url)


def _is_empty(url: sa.URL) -> bool:
    if url.get_backend_name() == "sqlite":
        path = Path(str(url.database))
        if not path.exists() or path.stat().st_size == 0:
            return True
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return not sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()


def _sqlite_template() -> str:
    if "sqlite" not in _templates:
        path = Path(tempfile.mkdtemp(prefix="amp-tmpl-", dir="/tmp")) / "template.db"
        migrate.upgrade(f"sqlite:///{path}")
        atexit.register(shutil.rmtree, path.parent, True)
        _templates["sqlite"] = str(path)
    return _templates["sqlite"]


def _clone_postgresql(url: sa.URL) -> None:
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        if "postgresql" not in _templates:
            name = f"amptrain_template_{uuid.uuid4().hex[:12]}"
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            migrate.upgrade(url.set(database=name).render_as_string(hide_password=False))
            atexit.register(_drop, url.set(database="postgres"), name)
            _templates["postgresql"] = name
        with admin.connect() as conn:
            # The fixture's empty database gives way to a copy under the same name.
            conn.execute(sa.text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
            conn.execute(
                sa.text(f'CREATE DATABASE "{url.database}" TEMPLATE "{_templates["postgresql"]}"')
            )
    finally:
        admin.dispose()


def _drop(admin_url: sa.URL, name: str) -> None:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
