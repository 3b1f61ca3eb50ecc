"""Open streams re-check their token: when the answer is due, one stream asks the database
and the token's other streams keep the last answer meanwhile (no query stampede), and a
revocation reaches every stream at the next answer."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from amptrain.server.token_checks import TokenChecks
from amptrain.store import tokens


def test_one_stream_asks_while_the_others_keep_the_last_answer(
    sf: sessionmaker[Session],
) -> None:
    with sf.begin() as s:
        digest = tokens.hash_token(tokens.create_token(s, "alice"))
    checks = TokenChecks(sf, recheck_s=0.0)  # every answer is due at once
    assert checks.cached(digest) is None  # nothing known: the first stream asks
    assert checks.check(digest) is True

    assert checks.cached(digest) is None  # due: this stream asks ...
    assert [checks.cached(digest) for _ in range(500)] == [True] * 500  # ... the rest wait
    with sf.begin() as s:
        tokens.revoke_token(s, "alice")
    assert checks.check(digest) is False  # the asking stream learns of the revocation
    assert checks.cached(digest) is None  # due again: one asks
    assert checks.cached(digest) is False  # and the others now get the new answer


def test_a_failed_question_lets_the_next_stream_ask(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        digest = tokens.hash_token(tokens.create_token(s, "bob"))
    checks = TokenChecks(sf, recheck_s=0.0)
    assert checks.check(digest) is True
    assert checks.cached(digest) is None

    def broken() -> Session:
        raise ConnectionError("database down")

    healthy, checks.sessions = checks.sessions, broken  # type: ignore[assignment]
    with pytest.raises(ConnectionError):
        checks.check(digest)
    checks.sessions = healthy
    assert checks.cached(digest) is None  # nobody is asking any more: this one asks
