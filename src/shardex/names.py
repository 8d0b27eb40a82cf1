"""Names that become paths: split names and the relative paths that config.yaml records.

Both are checked where they enter, so no name from the input places a file outside the
output. New split names follow a strict rule; a config.yaml read needs only one folder name
(older exports still open). The read rules are also patterns in ``schema/config.schema.json``
(``tests/test_hostile_names.py`` keeps them in step).
"""

from __future__ import annotations

import re
from typing import Final

#: Longest split name: it is a folder name, and some file systems cap names at 255 bytes.
MAX_SPLIT_NAME: Final = 128
SPLIT_NAME_RULE: Final = (
    "a split name starts with a letter or digit and holds only letters, digits, '_', '.' "
    f"and '-' (no '..', at most {MAX_SPLIT_NAME} characters)"
)
_SPLIT_NAME: Final = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Top-level files of an export, which a split folder of that name would block.
_RESERVED: Final = re.compile(r"config\.yaml|(metadata|errors)\..*", re.IGNORECASE)
_STORED_SPLIT_NAME: Final = re.compile(r"(?!\.\.?\Z)[^/\\\x00-\x1f\x7f]{1,255}")

# One path part; "." and ".." are refused apart.
_PART: Final = r"[^/\\\x00-\x1f\x7f]+"
_RELPATH: Final = re.compile(rf"{_PART}(?:/{_PART})*")


def split_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a split name (a phrase naming it, repr-quoted), or None."""
    if not isinstance(name, str):
        return f"split name {name!r} is not a string ({type(name).__name__})"
    if len(name) > MAX_SPLIT_NAME:
        return f"split name {name[:40]!r}... is {len(name)} characters long; {SPLIT_NAME_RULE}"
    if _SPLIT_NAME.fullmatch(name) is None:
        return f"unsafe split name {name!r}: {SPLIT_NAME_RULE}"
    if _RESERVED.fullmatch(name):
        return f"split name {name!r} is the name of a file of the export; rename the split"
    return None


def stored_split_name_problem(name: object) -> str | None:
    """Why a split name read from a config.yaml cannot be a folder of the export, or None."""
    if isinstance(name, str) and _STORED_SPLIT_NAME.fullmatch(name):
        return None
    return (
        f"unsafe split name {name!r}: a split of an export is one folder name (no '/', "
        "backslash or control character, not '.' or '..')"
    )


def relpath_problem(path: str) -> str | None:
    """Why ``path`` is not a normalised relative path inside an export, or None."""
    if _RELPATH.fullmatch(path) is None or any(p in (".", "..") for p in path.split("/")):
        return (
            f"path {path!r} is not a relative path inside the export ('/'-separated, "
            "no empty, '.' or '..' parts, no backslash or control character)"
        )
    return None
