"""The browser's filters, evaluated over the metadata table with Arrow compute.

The expression language is the filter stage's, checked by its own compiler, then evaluated
column-wise here; a null makes its comparison false (the stage would stop).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.errors import ConfigError
from shardex.pipeline.stages.filter import compile_expression

Mask = npt.NDArray[np.bool_]
MAX_PAGE: Final = 200
MAX_TEXT: Final = 500
#: Metadata columns (and Arrow's scalars) are 64-bit.
MAX_INT: Final = 2**63 - 1

_COMPARE: Final[dict[type[ast.cmpop], Callable[[Any, Any], Any]]] = {
    ast.Eq: pc.equal,
    ast.NotEq: pc.not_equal,
    ast.Lt: pc.less,
    ast.LtE: pc.less_equal,
    ast.Gt: pc.greater,
    ast.GtE: pc.greater_equal,
}
_CHECKED: Final = {
    ast.Add: pc.add_checked,
    ast.Sub: pc.subtract_checked,
    ast.Mult: pc.multiply_checked,
}


@dataclass(frozen=True, slots=True)
class Query:
    """What the grid asks for: filters and an order (page bounds are separate)."""

    labels: tuple[int, ...] = ()
    ranges: tuple[tuple[str, float | None, float | None], ...] = ()
    text: str = ""
    text_column: str = "key"
    expr: str = ""
    order: str = ""  # "": sample order
    descending: bool = False

    def filters(self) -> Query:
        """The query without labels and order (label counts are shown under the others)."""
        return Query((), self.ranges, self.text, self.text_column, self.expr)


def parse_query(
    params: Mapping[str, Sequence[str]],
    numeric: Sequence[str],
    text: Sequence[str],
    orderable: Sequence[str] = (),
) -> Query:
    """A :class:`Query` from URL parameters; ConfigError for unknown columns, bad numbers."""
    labels = tuple(_int64("label", integer_param("label", v)) for v in params.get("label", ()))
    bounds: dict[str, list[float | None]] = {}
    for name, values in params.items():
        side, dot, column = name.partition(".")
        if not dot or side not in ("min", "max") or not values or values[-1] == "":
            continue
        _known(column, numeric, "numeric column")
        bounds.setdefault(column, [None, None])[side == "max"] = _number(name, values[-1])
    ranges = tuple((c, lo, hi) for c, (lo, hi) in sorted(bounds.items()))
    q = _last(params, "q")
    column = _last(params, "in") or "key"
    _known(column, text, "text column")
    order = _last(params, "order")
    if order:
        _known(order, orderable or numeric, "column to order by")
    desc = _last(params, "desc") in ("1", "true", "on")
    return Query(labels, ranges, q, column, _last(params, "expr").strip(), order, desc)


def page_bounds(params: Mapping[str, Sequence[str]], default: int) -> tuple[int, int]:
    """``(offset, limit)`` from ``offset`` and ``limit``; limit is 1 to :data:`MAX_PAGE`."""
    offset = integer_param("offset", _last(params, "offset") or "0")
    limit = integer_param("limit", _last(params, "limit") or str(default))
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise ConfigError(
            f"page offset={offset} limit={limit} is out of bounds: offset must be >= 0 and "
            f"limit 1 to {MAX_PAGE}"
        )
    return offset, limit


def query_mask(table: pa.Table, query: Query, label_column: str | None) -> Mask:
    """Which rows of ``table`` the query keeps, as a numpy boolean array."""
    mask = np.ones(table.num_rows, dtype=bool)
    if query.labels and label_column is not None:
        wanted = pa.array(query.labels, pa.int64())
        mask &= _numpy(pc.is_in(table.column(label_column), value_set=wanted))
    for column, lo, hi in query.ranges:
        values = table.column(column)
        if lo is not None:
            mask &= _numpy(pc.greater_equal(values, lo))
        if hi is not None:
            mask &= _numpy(pc.less_equal(values, hi))
    if query.text:
        found = pc.match_substring(table.column(query.text_column), query.text, ignore_case=True)
        mask &= _numpy(found)
    if query.expr:
        mask &= expression_mask(table, query.expr)
    return mask


def expression_mask(table: pa.Table, expr: str) -> Mask:
    """Rows for which the filter-stage expression ``expr`` holds (names are columns)."""
    names: set[str] = set()
    compile_expression(expr, names)  # the filter stage's checks and messages
    missing = sorted(names - set(table.column_names))
    if missing:
        raise ConfigError(
            f"filter {expr!r} names {', '.join(map(repr, missing))}, which is not a column "
            f"the browser filters on (those are {', '.join(table.column_names)})"
        )
    try:
        value = _Columns(table, expr).evaluate(ast.parse(expr, mode="eval").body)
        if isinstance(value, pa.Scalar):
            value = value.as_py()
        if not isinstance(value, pa.ChunkedArray | pa.Array):
            return np.full(table.num_rows, bool(value))
        if not pa.types.is_boolean(value.type):
            value = _truth(value)
        return _numpy(value)
    except pa.ArrowException as exc:
        raise ConfigError(f"filter {expr!r} cannot be evaluated over the metadata: {exc}") from exc


class _Columns:
    """Evaluates a checked expression tree with one column per name."""

    def __init__(self, table: pa.Table, expr: str) -> None:
        self.table, self.expr = table, expr

    def refuse(self, what: str) -> ConfigError:
        return ConfigError(f"filter {self.expr!r}: {what} is not supported over columns")

    def evaluate(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, int) and abs(node.value) > MAX_INT:
                raise ConfigError(
                    f"filter {self.expr!r}: {node.value} is beyond the 64-bit integers "
                    "the metadata columns hold"
                )
            return node.value
        if isinstance(node, ast.Name):
            return _widened(self.table.column(node.id))
        if isinstance(node, ast.BoolOp):
            combine = pc.and_kleene if isinstance(node.op, ast.And) else pc.or_kleene
            parts = [_truth(self.evaluate(v)) for v in node.values]
            out = parts[0]
            for part in parts[1:]:
                out = combine(out, part)
            return out
        if isinstance(node, ast.UnaryOp):
            operand = self.evaluate(node.operand)
            if isinstance(node.op, ast.Not):
                return pc.invert(_truth(operand))
            return _value(pc.negate_checked(operand)) if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            return _value(self._arithmetic(node))
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return tuple(self._constant(e) for e in node.elts)
        raise self.refuse(type(node).__name__)  # compile_expression refused it already

    def _constant(self, node: ast.AST) -> Any:
        value = self.evaluate(node)
        if isinstance(value, pa.ChunkedArray | pa.Array):
            raise self.refuse("a collection holding a column")
        return value

    def _arithmetic(self, node: ast.BinOp) -> Any:
        left, right = self.evaluate(node.left), self.evaluate(node.right)
        if type(node.op) in _CHECKED:  # an integer overflow is an error: Python's never wrap
            return _CHECKED[type(node.op)](left, right)
        # Python's true division; a zero divisor stops, as in the stage (Arrow: inf or NaN)
        divisor = _float(right)
        zero = (
            pc.any(pc.equal(divisor, 0.0)).as_py()
            if isinstance(divisor, pa.ChunkedArray | pa.Array)
            else divisor == 0
        )
        if zero:
            raise ConfigError(
                f"filter {self.expr!r} divides by zero for some samples (the pipeline's "
                "filter stage stops there too)"
            )
        if isinstance(node.op, ast.Div):
            return pc.divide(_float(left), divisor)
        return _floor_or_mod(left, right, isinstance(node.op, ast.Mod))

    def _compare(self, node: ast.Compare) -> Any:
        left = self.evaluate(node.left)
        out: Any = None
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.evaluate(comparator)
            step = self._compare_one(op, left, right)
            out = step if out is None else pc.and_kleene(out, step)
            left = right
        return out

    def _compare_one(self, op: ast.cmpop, left: Any, right: Any) -> Any:
        if isinstance(op, ast.Is | ast.IsNot):  # the stage allows these with None only
            valid = pc.is_valid(left) if isinstance(left, pa.ChunkedArray) else left is not None
            return valid if isinstance(op, ast.IsNot) else pc.invert(valid)
        if isinstance(op, ast.In | ast.NotIn):
            found = self._contains(left, right)
            return pc.invert(found) if isinstance(op, ast.NotIn) else found
        return _COMPARE[type(op)](left, right)

    def _contains(self, item: Any, container: Any) -> Any:
        if isinstance(container, tuple):
            if not container:
                return False
            return pc.is_in(item, value_set=pa.array(container))
        if isinstance(container, pa.ChunkedArray) and isinstance(item, str):
            return pc.match_substring(container, item)  # "cat" in caption: a substring
        raise self.refuse("'in' other than COLUMN in (...) or 'TEXT' in COLUMN")


def _floor_or_mod(left: Any, right: Any, mod: bool) -> Any:
    """Python's ``//`` (``mod``: ``%``) of columns, as floats, through numpy's, which
    rounds as Python's does (Arrow's ``x - floor(x / y) * y`` differs in the last bits)."""
    columns = [v for v in (left, right) if isinstance(v, pa.ChunkedArray | pa.Array)]
    if not columns:  # constants alone: Python's own
        return left % right if mod else left // right
    valid = np.logical_and.reduce([_numpy(pc.is_valid(c)) for c in columns])
    a, b = (
        pc.cast(v, pa.float64()).to_numpy() if isinstance(v, pa.ChunkedArray | pa.Array) else v
        for v in (left, right)
    )
    return pa.array((np.remainder if mod else np.floor_divide)(a, b), mask=~valid)


def _value(result: Any) -> Any:
    """An Arrow scalar as its Python value: arithmetic on constants alone then goes on by
    Python's rules (``-8 / -7`` divides as floats, ``not (1 - 1)`` is true)."""
    return result.as_py() if isinstance(result, pa.Scalar) else result


def _widened(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Narrow integers as int64, so arithmetic overflows no sooner than it must."""
    kind = column.type
    if pa.types.is_integer(kind) and kind not in (pa.int64(), pa.uint64()):
        return pc.cast(column, pa.int64())
    return column


def _truth(value: Any) -> Any:
    """Python's truth of each value: non-zero numbers, non-empty strings."""
    if not isinstance(value, pa.ChunkedArray | pa.Array):
        return bool(value)
    if pa.types.is_boolean(value.type):
        return value
    if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
        return pc.greater(pc.utf8_length(value), 0)
    return pc.not_equal(value, 0)


def _float(value: Any) -> Any:
    if isinstance(value, pa.ChunkedArray | pa.Array):
        return pc.cast(value, pa.float64())
    return float(value) if isinstance(value, int | float) else value


def _numpy(value: Any) -> Mask:
    """A boolean column as numpy, a missing value as False."""
    filled = pc.fill_null(value, False)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=bool)


def _last(params: Mapping[str, Sequence[str]], name: str) -> str:
    values = params.get(name, ())
    value = values[-1] if values else ""
    if len(value) > MAX_TEXT and name != "expr":  # the stage bounds expressions itself
        raise ConfigError(f"parameter {name!r} is {len(value)} characters (at most {MAX_TEXT})")
    return value


def integer_param(name: str, text: str) -> int:
    """A query parameter's integer; a ConfigError (a 400) names the parameter."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"parameter {name!r} must be an integer, got {text[:40]!r}") from None


def _int64(name: str, value: int) -> int:
    if abs(value) > MAX_INT:
        raise ConfigError(f"parameter {name!r} is {value}, beyond the 64-bit integers it names")
    return value


def _number(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"parameter {name!r} must be a number, got {text[:40]!r}") from None
    if value != value:
        raise ConfigError(f"parameter {name!r} must be a number, got NaN")
    return value


def _known(column: str, known: Sequence[str], what: str) -> None:
    if column not in known:
        raise ConfigError(
            f"{column[:80]!r} is not a {what} of this export (known: {', '.join(known) or 'none'})"
        )
