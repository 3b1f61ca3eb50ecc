"""Engines, sessions and the database clock.

Leases are compared against :func:`db_now`, the database server's clock, so
workers with skewed clocks still agree on who holds a job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

SQLITE_BUSY_TIMEOUT_MS = 30_000


class db_now(FunctionElement[float]):
    """SQL expression: the database clock as float epoch seconds."""

    type = sa.Float(precision=53)
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday('now') has millisecond resolution; 2440587.5 is the Unix epoch.
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "postgresql")
def _db_now_pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


def make_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An engine configured for this service: SQLite gets WAL, a 30 s busy timeout and
    foreign keys; PostgreSQL gets pre-ping so a restarted server costs no request."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        engine = sa.create_engine(parsed, **kwargs)
        sa.event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return sa.create_engine(parsed, **kwargs)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cur = dbapi_connection.cursor()
    try:
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()


def make_session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit (the API serializes them then)."""
    return sessionmaker(engine, expire_on_commit=False)


def dialect_insert(s: Session, model: Any) -> Any:
    """``INSERT`` of the session's dialect, which has ``on_conflict_do_nothing``."""
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model)
    if dialect == "sqlite":
        return sqlite.insert(model)
    raise RuntimeError(f"unsupported database: {dialect}")


def execute_many(s: Session, template: str, rows: list[tuple[Any, ...]]) -> None:
    """Run ``template`` for every row through the driver's own executemany (one prepared
    statement, no ORM on the recorder's hot path); ``{marks}`` in it becomes the row's
    placeholders in the driver's style (``?`` for sqlite3, ``%s`` for psycopg)."""
    if not rows:
        return
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "sqlite":
        conn.executemany(template.format(marks=", ".join("?" * len(rows[0]))), rows)
        return
    with conn.cursor() as cur:
        cur.executemany(template.format(marks=", ".join(["%s"] * len(rows[0]))), rows)


def upsert_many(
    s: Session, template: str, table: str, columns: Sequence[tuple[str, str]], rows: list[Any]
) -> None:
    """Insert-or-update ``rows`` (tuples in the order of ``columns``: ``(name, type)`` with
    type ``text``, ``int``, ``bool``, ``float8`` or ``bytea``): ``template`` (:func:`execute_many`'s, for SQLite)
    through its executemany; on PostgreSQL ONE statement over the unnested columns, each
    sent as an array literal (:func:`_array`), with ``template``'s ``ON CONFLICT`` clause.
    psycopg's executemany cost ~11 us of client CPU a roll-up row and its list dumping
    ~8.5; the literals ~2.9 (this machine, 700 rows)."""
    if not rows:
        return
    if s.get_bind().dialect.name == "sqlite":
        execute_many(s, template, rows)
        return
    names = ", ".join(name for name, _ in columns)
    unnest, data = unnested(columns, rows)
    conflict = template[template.index(" ON CONFLICT ") :]
    sql = f"INSERT INTO {table} ({names}) SELECT * FROM {unnest}{conflict}"
    conn: Any = s.connection().connection.driver_connection
    with conn.cursor() as cur:
        cur.execute(sql, data)


def unnested(columns: Sequence[tuple[str, str]], rows: list[Any]) -> tuple[str, list[Any]]:
    """PostgreSQL: ``unnest(...)`` over the columns of ``rows`` (as for :func:`upsert_many`)
    and its parameters: each column an array literal (:func:`_array`), a ``bytea`` column a
    binary array parameter (as hex text it would cost both sides a pass over every byte)."""
    arrays = ", ".join(
        "%b::bytea[]" if kind == "bytea" else f"%s::text::{kind}[]" for _, kind in columns
    )
    data = [
        list(col) if kind == "bytea" else _array(col, kind)
        for col, (_, kind) in zip(zip(*rows, strict=True), columns, strict=True)
    ]
    return f"unnest({arrays})", data


def _array(column: Sequence[Any], kind: str) -> str:
    """A PostgreSQL array literal of ``column``: NULL for None, numbers by ``repr`` of
    ``int``/``float`` (a float's shortest round-trip form: the same float8 comes back, -0.0,
    nan and inf too), strings double-quoted with ``"`` and ``\\`` escaped."""
    if kind == "text":
        if not column:
            return "{}"
        try:
            joined = "".join(column)
        except TypeError:  # a NULL among them
            joined = '"'
        # Nothing to escape (nearly always: ids, kinds, series names): one join in C, not a
        # Python expression per value.
        if '"' not in joined and "\\" not in joined:
            return '{"' + '","'.join(column) + '"}'
        body = ",".join(
            "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            for v in column
        )
    else:
        cast = float if kind == "float8" else int
        if None in column:
            body = ",".join("NULL" if v is None else repr(cast(v)) for v in column)
        else:
            body = ",".join(map(repr, map(cast, column)))
    return "{" + body + "}"


def database_now(s: Session) -> float:
    """The database clock, read once (for tests and diagnostics)."""
    return float(s.execute(sa.select(db_now())).scalar_one())


def ping(engine: sa.Engine) -> None:
    """Raise unless the database answers a trivial query (readiness checks)."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))


@contextmanager
def needs_migrated(database_url: str) -> Iterator[None]:
    """Turn a first query's failure on a database not migrated (or not reachable) into a
    ``RuntimeError`` that says what to run, instead of a bare traceback."""
    try:
        yield
    except (sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
        url = sa.make_url(database_url).render_as_string(hide_password=True)
        raise RuntimeError(
            f"database {url} is not ready ({type(exc.orig).__name__}: {exc.orig}); "
            "run `amptrain db upgrade` first"
        ) from exc
