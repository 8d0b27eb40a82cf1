"""The filter stage: keep the samples for which a metadata expression holds.

The expression is compiled into closures over whitelisted :mod:`ast` nodes, never
``eval``-ed, so no call, attribute, subscript or import can run.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any, ClassVar, Final

from shardex.errors import ConfigError
from shardex.pipeline.stage import Batch, Sample, Stage
from shardex.pipeline.stages._common import sample_name

Evaluate = Callable[[Sample], Any]
MAX_EXPR_LENGTH: Final = 2000
ALLOWED: Final = (
    "comparisons (== != < <= > >=, chained), in / not in, is / is not None, and / or / not, "
    "+ - * / // %, sample keys as names, numbers, strings, True/False/None, "
    "tuples/lists/sets of these"
)
_COMPARE: Final[dict[type[ast.cmpop], Callable[[Any, Any], Any]]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_BINARY: Final[dict[type[ast.operator], Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: lambda a, b: operator.mul(_number(a), _number(b)),
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: lambda a, b: operator.mod(_number(a), _number(b)),
}
_UNARY: Final[dict[type[ast.unaryop], Callable[[Any], Any]]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class FilterStage(Stage):
    """Keep the samples whose metadata satisfy ``expr``, e.g. ``"0.2 < nsfw_score <= 0.5"``.

    Args:
        expr: comparisons, boolean logic, arithmetic, sample keys and constants.

    Raises:
        ConfigError: an expression outside that subset; from :meth:`process`, a sample
            lacking a name or a failing comparison.
    """

    name: ClassVar[str] = "filter"

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self._compile()

    def _compile(self) -> None:
        names: set[str] = set()
        self._evaluate = compile_expression(self.expr, names)
        self.needs = tuple(sorted(names))

    def process(self, batch: Batch) -> Batch:
        return [sample for sample in batch if self.holds(sample)]

    def holds(self, sample: Sample) -> bool:
        try:
            return bool(self._evaluate(sample))
        except ConfigError:
            raise
        except Exception as exc:  # a TypeError, ZeroDivisionError, ambiguous array truth ...
            raise ConfigError(
                f"filter {self.expr!r} failed on sample {sample_name(sample)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def __getstate__(self) -> dict[str, Any]:
        # closures do not pickle: workers recompile the expression
        return {"expr": self.expr}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.expr = state["expr"]
        self._compile()


def compile_expression(expr: str, names: set[str]) -> Evaluate:
    """Compile ``expr`` into a function of a sample; the names it reads go into ``names``."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(f"filter expression {expr!r} must be a non-empty string")
    if len(expr) > MAX_EXPR_LENGTH:
        raise ConfigError(
            f"filter expression is {len(expr)} characters (at most {MAX_EXPR_LENGTH})"
        )
    try:
        return _Compiler(expr, names).compile(ast.parse(expr, mode="eval").body)
    except SyntaxError as exc:
        raise ConfigError(f"filter expression {expr!r} is not valid syntax: {exc.msg}") from None
    except RecursionError:
        raise ConfigError(f"filter expression {expr[:80]!r}... is nested too deeply") from None


class _Compiler:
    """Turns a whitelisted AST into nested closures."""

    def __init__(self, expr: str, names: set[str]) -> None:
        self.expr = expr
        self.names = names

    def refuse(self, node: ast.AST, why: str = "") -> ConfigError:
        what = why or f"{type(node).__name__} is not allowed"
        column = getattr(node, "col_offset", 0) + 1
        return ConfigError(
            f"filter expression {self.expr!r}: {what} (column {column}); allowed: {ALLOWED}"
        )

    def compile(self, node: ast.AST) -> Evaluate:
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.BoolOp):
            parts = [self.compile(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda s: all(part(s) for part in parts)
            return lambda s: any(part(s) for part in parts)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            unary, operand = _UNARY[type(node.op)], self.compile(node.operand)
            return lambda s: unary(operand(s))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            binary, left = _BINARY[type(node.op)], self.compile(node.left)
            right = self.compile(node.right)
            return lambda s: binary(left(s), right(s))
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = [self.compile(e) for e in node.elts]
            return lambda s: tuple(item(s) for item in items)
        raise self.refuse(node)

    def _constant(self, node: ast.Constant) -> Evaluate:
        value = node.value
        if value is not None and not isinstance(value, bool | int | float | str):
            raise self.refuse(node, f"constant {value!r} is not a number, string or None")
        return lambda s: value

    def _name(self, key: str) -> Evaluate:
        self.names.add(key)
        expr = self.expr

        def lookup(sample: Sample) -> Any:
            try:
                return sample[key]
            except KeyError:
                raise ConfigError(
                    f"filter {expr!r}: sample {sample_name(sample)} has no key {key!r}; "
                    f"its keys are {sorted(sample)}"
                ) from None

        return lookup

    def _compare(self, node: ast.Compare) -> Evaluate:
        for op, right in zip(node.ops, node.comparators, strict=True):
            none = isinstance(right, ast.Constant) and right.value is None
            if isinstance(op, ast.Is | ast.IsNot) and not none:
                raise self.refuse(node, "'is' / 'is not' compare only with None (use == or !=)")
        ops = [_COMPARE[type(op)] for op in node.ops]
        operands = [self.compile(node.left), *(self.compile(c) for c in node.comparators)]

        def compare(sample: Sample) -> bool:
            left = operands[0](sample)
            for op, operand in zip(ops, operands[1:], strict=True):
                right = operand(sample)
                if not op(left, right):
                    return False
                left = right
            return True

        return compare


def _number(value: Any) -> Any:
    # '"x" * 10**9' or '"%999999999d" % 1' would allocate gigabytes: numbers only
    if isinstance(value, str | bytes | tuple | list):
        raise TypeError("'*' and '%' take numbers only")
    return value
