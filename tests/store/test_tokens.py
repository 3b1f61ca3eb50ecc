"""Tokens are stored hashed; the admin token comes from settings or is generated once."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.settings import Settings
from amptrain.store import tokens
from amptrain.store.models import ApiToken


def settings_for(data_dir: Path, admin_token: str | None = None) -> Settings:
    return Settings(data_dir=data_dir, admin_token=SecretStr(admin_token) if admin_token else None)


def test_create_and_verify_store_only_the_hash(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        plain = tokens.create_token(s, "ci")
    with sf() as s:
        row = tokens.verify(s, plain)
        assert row is not None and row.name == "ci" and not row.is_admin
        assert plain not in s.scalars(sa.select(ApiToken.token_hash)).all()
        assert row.token_hash == tokens.hash_token(plain)
        assert tokens.verify(s, plain + "x") is None
        assert tokens.verify(s, "") is None
    with pytest.raises(tokens.TokenNameTaken), sf.begin() as s:
        tokens.create_token(s, "ci")


def test_generated_admin_token_is_saved_0600_and_returned_once(
    sf: sessionmaker[Session], tmp_path: Path
) -> None:
    settings = settings_for(tmp_path / "data")
    with sf.begin() as s:
        plain = tokens.ensure_admin_token(s, settings)
    assert plain is not None
    path = settings.data_dir / "admin-token"
    assert path.read_text().strip() == plain
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with sf.begin() as s:
        assert tokens.ensure_admin_token(s, settings) is None  # printed once only
        row = tokens.verify(s, plain)
        assert row is not None and row.is_admin and row.name == "admin"


def test_admin_token_from_settings_wins(sf: sessionmaker[Session], tmp_path: Path) -> None:
    with sf.begin() as s:
        assert tokens.ensure_admin_token(s, settings_for(tmp_path)) is not None
    with sf.begin() as s:
        assert tokens.ensure_admin_token(s, settings_for(tmp_path, "s3cret-token")) is None
    with sf() as s:
        row = tokens.verify(s, "s3cret-token")
        assert row is not None and row.is_admin
        assert s.scalar(sa.select(sa.func.count()).select_from(ApiToken)) == 1
