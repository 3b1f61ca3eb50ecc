"""The one cursor format: exactly ``MS-SEQ`` in ASCII digits, each part an int64."""

from __future__ import annotations

import pytest

from amptrain.contract.cursor import Cursor, CursorError


def test_cursors_parse_and_print_back() -> None:
    assert Cursor.parse("1700000000000-7") == Cursor(1700000000000, 7)
    assert Cursor.parse(b"0-0") == Cursor(0, 0)
    assert str(Cursor.parse(f"{2**63 - 1}-{2**63 - 1}")) == f"{2**63 - 1}-{2**63 - 1}"


@pytest.mark.parametrize(
    "text",
    [
        "\u0663-\u0663",  # Arabic-Indic digits: int() reads them, the stream ids never hold them
        "\uff11-\uff12",  # fullwidth digits
        "1-2\n",  # a trailing newline ($ matched before it)
        "1-2 ",
        " 1-2",
        "1-",
        "-1",
        "1_0-2",
        f"{2**63}-0",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(CursorError):
        Cursor.parse(text)
