"""Tokens expire and can be revoked; migration 0003 adds (and removes) the columns."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.settings import Settings
from amptrain.store import migrate, tokens
from amptrain.store.db import make_engine
from amptrain.store.models import ApiToken, utcnow


def test_expired_and_revoked_tokens_do_not_verify(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        day = tokens.create_token(s, "day", expires_in=timedelta(days=1))
        old = tokens.create_token(s, "old", expires_in=timedelta(days=1))
        gone = tokens.create_token(s, "gone")
    with sf.begin() as s:
        row = s.scalars(sa.select(ApiToken).where(ApiToken.name == "old")).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
        revoked = tokens.revoke_token(s, "gone")
        assert revoked.revoked_at is not None
        first = revoked.revoked_at
    with sf.begin() as s:
        ok = tokens.verify(s, day)
        assert ok is not None and ok.expires_at is not None
        assert timedelta(hours=23) < ok.expires_at - utcnow() <= timedelta(days=1)
        assert tokens.verify(s, old) is None
        assert tokens.verify(s, gone) is None
        found = tokens.find(s, gone)
        assert found is not None and found.name == "gone"  # to say why it was refused
        assert tokens.revoke_token(s, "gone").revoked_at == first  # the first time stays
        assert [r.name for r in tokens.list_tokens(s)] == ["day", "old", "gone"]
    with pytest.raises(tokens.TokenNotFound), sf.begin() as s:
        tokens.revoke_token(s, "nobody")
    with pytest.raises(tokens.TokenNameTaken), sf.begin() as s:
        tokens.create_token(s, "gone")  # a revoked name stays taken: its jobs keep their owner


def test_a_revoked_admin_token_stays_revoked_across_restarts(
    sf: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, admin_token=SecretStr("first-admin-token"))
    with sf.begin() as s:
        tokens.ensure_admin_token(s, settings)
        tokens.revoke_token(s, tokens.ADMIN_NAME)
    with sf.begin() as s:
        tokens.ensure_admin_token(s, settings)  # a restart with the same value
        assert tokens.verify(s, "first-admin-token") is None
    rotated = Settings(data_dir=tmp_path, admin_token=SecretStr("second-admin-token"))
    with sf.begin() as s:
        tokens.ensure_admin_token(s, rotated)  # a new value is a new, active token
        assert tokens.verify(s, "second-admin-token") is not None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("2w", 1209600), ("45s", 45)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert tokens.parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "0d", "-1d", "1y", "1.5h", "9999999d"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        tokens.parse_duration(text)


def _columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {c["name"] for c in sa.inspect(engine).get_columns("api_tokens")}
    finally:
        engine.dispose()


def test_migration_0003_adds_and_removes_expiry_and_revocation(database_url: str) -> None:
    migrate.upgrade(database_url, "0002")
    engine = make_engine(database_url)
    with engine.begin() as conn:  # a token made before the upgrade keeps working after it
        conn.execute(
            sa.text(
                "INSERT INTO api_tokens (name, token_hash, is_admin, created_at) "
                "VALUES ('early', :h, false, CURRENT_TIMESTAMP)"
            ),
            {"h": tokens.hash_token("early-token")},
        )
    assert not {"expires_at", "revoked_at"} & _columns(database_url)
    migrate.upgrade(database_url, "0003")
    assert {"expires_at", "revoked_at"} <= _columns(database_url)
    with Session(engine) as s:
        row = tokens.verify(s, "early-token")
        assert row is not None and row.expires_at is None and row.revoked_at is None
    migrate.downgrade(database_url, "0002")
    assert not {"expires_at", "revoked_at"} & _columns(database_url)
    assert migrate.current_revision(database_url) == "0002"
    engine.dispose()
