"""``.json`` members of WebDataset tars as typed metadata columns: objects Parquet can
store, the union of the samples' fields, one type a field (ints widen to float), fields
named like shardex's own kept as ``json_<name>`` (img2dataset writes ``key``).
"""

from __future__ import annotations

import json
from typing import Any, Final

import pyarrow as pa

from shardex.errors import SourceError
from shardex.quoting import one_line
from shardex.refs.scan import RESERVED

#: Deepest JSON nesting kept (the member's object is level 1). Parquet refuses schemas
#: nested past 100 levels, and each JSON list costs it up to three.
MAX_JSON_DEPTH: Final = 20
#: Kept as ``json_<name>``; ``split`` is the sample's split.
RENAMED_JSON_FIELDS: Final = RESERVED - {"split"}
_ARROW_ERRORS: Final = (pa.ArrowException, ValueError, TypeError, OverflowError)


def json_member(data: bytes, name: str) -> tuple[dict[str, Any], str | None]:
    """A member's fields (reserved names renamed), or ``({}, why it cannot be used)``."""
    try:
        value = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return {}, f"member {name!r} is not valid JSON ({exc})"
    except RecursionError:
        return {}, f"member {name!r} is JSON nested deeper than {MAX_JSON_DEPTH} levels"
    if not isinstance(value, dict):
        return {}, f"member {name!r} holds a JSON {type(value).__name__}, not an object"
    problem = _shape_problem(value)
    if problem is not None:
        return {}, f"member {name!r} {problem}"
    return _rename_reserved(value, name)


def _shape_problem(value: dict[str, Any]) -> str | None:
    """Why Parquet cannot store a JSON object, or None (no recursion: it may be deep)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, where = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"is JSON nested deeper than {MAX_JSON_DEPTH} levels (at {where!r})"
        if isinstance(item, dict):
            if not item and depth > 1:
                return f"holds an empty JSON object at {where!r}, which Parquet cannot store"
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def _rename_reserved(value: dict[str, Any], name: str) -> tuple[dict[str, Any], str | None]:
    """Keep fields named like shardex's own columns as ``json_<name>``."""
    if RENAMED_JSON_FIELDS.isdisjoint(value):
        return value, None
    out = {k: v for k, v in value.items() if k not in RENAMED_JSON_FIELDS}
    for k in sorted(RENAMED_JSON_FIELDS.intersection(value)):
        new = f"json_{k}"
        if new in value:
            return {}, (
                f"member {name!r}: field {k!r} is reserved by shardex and is kept as {new!r}, "
                "but the member has that field too; rename one of them"
            )
        out[new] = value[k]
    return out, None


def metadata_columns(
    meta: list[dict[str, Any]], keys: list[str], originals: list[str], where: str
) -> pa.Table | None:
    """The samples' JSON fields as typed columns.

    Raises:
        SourceError: a field holds values of two types, or a value Arrow cannot store.
    """
    names: dict[str, None] = {}
    for fields in meta:
        names.update(dict.fromkeys(fields))
    if not names:
        return None
    columns = {}
    for name in names:
        values = [fields.get(name) for fields in meta]
        try:
            columns[name] = pa.array(values)
        except _ARROW_ERRORS:
            i = _first_unconvertible(values)
            raise _type_error(name, values, i, f"{keys[i]!r} ({originals[i]!r})", where) from None
    split = columns.get("split")
    if split is not None and not (pa.types.is_string(split.type) or pa.types.is_null(split.type)):
        raise SourceError(f"{where}: json field 'split' holds {split.type}, not split names")
    return pa.table(columns)


class MetadataTypes:
    """The type each JSON field took so far: later batches are cast to it where nothing is lost
    (ints to float, nulls to anything); floats after ints make it float; else refused.
    """

    def __init__(self, where: str, batch_size: int) -> None:
        self.where = where
        self.batch_size = batch_size
        self.types: dict[str, pa.DataType] = {}

    def fit(self, meta: pa.Table, keys: list[str], originals: list[str]) -> pa.Table:
        """``meta`` with each column in its field's type (the first batch sets it).

        Raises:
            SourceError: a field's values have another type than in earlier batches.
        """
        for i, name in enumerate(meta.column_names):
            column = meta.column(i)
            known = self.types.get(name)
            if known is None or pa.types.is_null(known):
                if not pa.types.is_null(column.type) or known is None:
                    self.types[name] = column.type
                continue
            if column.type == known:
                continue
            if pa.types.is_null(column.type) or _widens_to(column.type, known):
                try:
                    meta = meta.set_column(i, name, column.cast(known))
                    continue
                except _ARROW_ERRORS:  # an int too large for a float: refused below
                    pass
            if pa.types.is_integer(known) and pa.types.is_floating(column.type):
                self.types[name] = column.type
                continue
            valid = column.is_valid().to_pylist()
            at = valid.index(True) if True in valid else 0
            sample = f"{keys[at]!r} ({originals[at]!r})"
            if _widens_to(known, column.type):  # one JSON type, narrower in the first batch
                raise SourceError(
                    f"{self.where}: json field {name!r} holds {one_line(str(column.type))} "
                    f"in sample {sample}, but only {one_line(str(known))} in the batch of "
                    f"{self.batch_size} samples where it first appears, which set its type "
                    "(sources are read in batches); read more samples as one batch "
                    "(the source's batch_size) or give the first ones values of the wider type"
                )
            raise SourceError(
                f"{self.where}: json field {name!r} holds {one_line(str(column.type))} in "
                f"sample {sample} but {one_line(str(known))} in earlier samples; give the "
                "field one type in every .json member"
            )
        return meta


def _widens_to(found: pa.DataType, known: pa.DataType) -> bool:
    """Whether values of type ``found`` fit ``known`` (ints widen to float)."""
    try:
        merged = pa.unify_schemas(
            [pa.schema([("x", known)]), pa.schema([("x", found)])], promote_options="permissive"
        )
    except _ARROW_ERRORS:
        return False
    return bool(merged.field("x").type == known)


def _type_error(name: str, values: list[Any], i: int, sample: str, where: str) -> SourceError:
    try:
        alone = pa.array([values[i]]).type
    except _ARROW_ERRORS as exc:  # too large an int, a list of mixed types, ...
        return SourceError(
            f"{where}: json field {name!r} of sample {sample} cannot be stored as a column "
            f"({one_line(str(exc))}); fix the member"
        )
    return SourceError(
        f"{where}: json field {name!r} holds {one_line(str(alone))} in sample {sample} but "
        f"{one_line(str(pa.array(values[:i]).type))} in earlier samples; give the field one "
        "type in every .json member"
    )


def _first_unconvertible(values: list[Any]) -> int:
    """The index of the first value that makes ``values[: i + 1]`` fail to convert."""
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            pa.array(values[: mid + 1])
        except _ARROW_ERRORS:
            hi = mid
        else:
            lo = mid + 1
    return lo
