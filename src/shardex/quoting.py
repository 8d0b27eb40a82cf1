"""Names from the input made safe for text: valid UTF-8 (not lone surrogates, which
Parquet, YAML and terminals refuse), and one line in messages."""

from __future__ import annotations

import os
import re
from typing import Final

#: Characters that would break a one-line message (str.splitlines splits at all of them).
_LINE_BREAKING: Final = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]")


def printable(name: str) -> str:
    """A name as valid UTF-8 text: bytes that are not UTF-8 become ``\\xNN`` escapes."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    return name


def quoted(name: str) -> str:
    """A name quoted for a one-line message: line breaks escaped as repr() would, nothing
    else changed (a backslash stays one backslash)."""
    text = _LINE_BREAKING.sub(lambda m: repr(m.group())[1:-1], printable(name))
    return f"'{text}'"


def one_line(text: str) -> str:
    """``text`` with every control or line-breaking character escaped."""
    if text.isprintable():  # the common case, one C-level pass
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def collapsed(text: object) -> str:
    """``str(text)`` on one line (third-party messages that span lines, like PyYAML's)."""
    return " ".join(str(text).split())
