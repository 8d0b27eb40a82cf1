"""Read the YAML that ``yaml.safe_dump`` writes for config.yaml, without importing PyYAML.

Importing PyYAML costs ~10 ms, more than a whole open. Block mappings and sequences,
one-line plain and single-quoted scalars, ``[]`` and ``{}`` are read here; anything else
raises :class:`Unsupported` for PyYAML to parse, so this returns what ``yaml.safe_load``
returns or nothing (tests/test_yaml_subset.py compares the two).
"""

from __future__ import annotations

import re
from typing import Any, Final


class Unsupported(ValueError):
    """The text uses YAML beyond this subset: parse it with PyYAML."""


#: A plain scalar: no leading indicator ("-1" is a number), printable ASCII, single spaces.
_PLAIN: Final = re.compile(r"(?:[A-Za-z0-9_./]|-(?=[0-9.]))[!-~]*(?: [!-~]+)*")
_CONTROL: Final = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_SINGLE_QUOTED: Final = re.compile(r"'((?:[^']|'')*)'")
#: Plain words YAML 1.1 (PyYAML's resolver) reads as booleans and null.
_WORDS: Final[dict[str, Any]] = {
    **dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
    **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False),
    **dict.fromkeys(("null", "Null", "NULL"), None),
}
_INT: Final = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT: Final = re.compile(r"-?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")
#: PyYAML's implicit resolvers of scalars starting with a digit, sign or dot: any that is
#: not a simple int or float is left to PyYAML.
_RESOLVED: Final = re.compile(
    r"""[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN)
    |[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+
    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
    |[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
    |[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?
     (?:[Tt]|[\ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?
     (?:[\ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?""",
    re.X,
)

Lines = list[tuple[int, str]]


def load(text: str | bytes) -> Any:
    """The document in ``text``, as ``yaml.safe_load`` reads it, or :class:`Unsupported`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise Unsupported("not UTF-8") from None
    # PyYAML refuses control characters; non-ASCII text (its printable ranges) is left to it
    if not text.isascii() or _CONTROL.search(text) or " #" in text or not text.endswith("\n"):
        raise Unsupported("not the subset")
    lines: Lines = []
    for line in text[:-1].split("\n"):
        content = line.lstrip(" ")
        if not content or content.startswith("#") or content.endswith(" "):
            raise Unsupported("a blank line, a comment or a trailing space")
        lines.append((len(line) - len(content), content))
    if lines[0][0] != 0:
        raise Unsupported("an indented first line")
    try:
        value, end = _block(lines, 0, 0)
    except RecursionError:
        raise Unsupported("nested too deeply") from None
    if end != len(lines):
        raise Unsupported(f"line {end + 1}: unexpected indentation")
    return value


def _block(lines: Lines, i: int, indent: int) -> tuple[Any, int]:
    content = lines[i][1]
    if content == "-" or content.startswith("- "):
        return _sequence(lines, i, indent)
    if _entry(content) is None:
        raise Unsupported(f"line {i + 1}: not a mapping entry")
    return _mapping(lines, i, indent)


def _sequence(lines: Lines, i: int, indent: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
        rest = lines[i][1][2:]
        if _entry(rest) is not None:  # "- key: value" opens a mapping two columns in
            lines[i] = (indent + 2, rest)
            item, i = _mapping(lines, i, indent + 2)
        else:
            item, i = _scalar(rest, i), i + 1
        items.append(item)
    return items, i


def _mapping(lines: Lines, i: int, indent: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        entry = _entry(lines[i][1])
        if entry is None:
            raise Unsupported(f"line {i + 1}: not a mapping entry")
        key_text, value_text = entry
        key = _scalar(key_text, i)
        if not isinstance(key, str | int) or isinstance(key, bool) or key in out:
            raise Unsupported(f"line {i + 1}: a repeated or non-text key")
        i += 1
        if value_text:
            out[key] = _scalar(value_text, i - 1)
        elif i < len(lines) and lines[i][0] > indent:
            out[key], i = _block(lines, i, lines[i][0])
        elif i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            out[key], i = _sequence(lines, i, indent)  # PyYAML's unindented list
        else:
            out[key] = None
    return out, i


def _entry(content: str) -> tuple[str, str] | None:
    cut = content.find(": ")
    if cut < 0:
        return (content[:-1], "") if content.endswith(":") else None
    return content[:cut], content[cut + 2 :]


def _scalar(text: str, i: int) -> Any:
    if text == "[]":
        return []
    if text == "{}":
        return {}
    quoted = _SINGLE_QUOTED.fullmatch(text)
    if quoted is not None:
        return quoted.group(1).replace("''", "'")
    if _PLAIN.fullmatch(text) is None or ": " in text or text.endswith(":"):
        raise Unsupported(f"line {i + 1}: a scalar beyond the subset")
    if text in _WORDS:
        return _WORDS[text]
    if text[0] in "-0123456789.":
        if _INT.fullmatch(text):
            return int(text)
        if _FLOAT.fullmatch(text):
            return float(text)
        if _RESOLVED.fullmatch(text):
            raise Unsupported(f"line {i + 1}: a number or date PyYAML reads its own way")
    return text
