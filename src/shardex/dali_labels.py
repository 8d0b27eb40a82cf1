"""``.cls`` members (ASCII digits, e.g. ``b"12"``) to integer labels, as DALI graph nodes.

DALI gives a label as ASCII codes; :func:`ascii_label` parses them with arithmetic only
(right-pad with ``"0"``, weigh by powers of ten, sum, divide out the padding). The ops that
differ come from a :class:`LabelOps`, so the tests run the same expression on numpy.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import numpy as np

#: Powers of ten up to 10**10 are exact in float32, which DALI's ``math.pow`` may use.
MAX_DIGITS: Final = 10
_ZERO: Final = ord("0")
WEIGHTS: Final = 10 ** np.arange(MAX_DIGITS - 1, -1, -1, dtype=np.int64)


class LabelOps(Protocol):
    """The operations :func:`ascii_label` needs beyond ``+ - * // ==`` on one sample."""

    def pad(self, text: Any, width: int, fill: int) -> Any: ...

    def int64(self, x: Any) -> Any: ...

    def weigh(self, digits: Any) -> Any:
        """``digits * WEIGHTS`` (elementwise)."""

    def total(self, x: Any) -> Any: ...

    def length(self, text: Any) -> Any: ...

    def pow10(self, exponent: Any) -> Any: ...


def ascii_label(text: Any, ops: LabelOps) -> Any:
    """The integer a ``.cls`` member spells; -1 for a sample without one (empty bytes)."""
    length = ops.length(text)
    digits = ops.int64(ops.pad(text, MAX_DIGITS, _ZERO)) - _ZERO
    value = ops.total(ops.weigh(digits)) // ops.pow10(MAX_DIGITS - length)
    return value - ops.int64(length == 0)


class DaliOps:
    """:class:`LabelOps` as DALI operators (built inside a pipeline definition)."""

    def __init__(self) -> None:
        import importlib

        self.fn = importlib.import_module("nvidia.dali.fn")
        self.types = importlib.import_module("nvidia.dali.types")
        self.math = importlib.import_module("nvidia.dali.math")

    def pad(self, text: Any, width: int, fill: int) -> Any:
        return self.fn.pad(text, fill_value=fill, shape=[width])

    def int64(self, x: Any) -> Any:
        return self.fn.cast(x, dtype=self.types.INT64)

    def weigh(self, digits: Any) -> Any:
        return digits * self.types.Constant(WEIGHTS, device="cpu")

    def total(self, x: Any) -> Any:
        return self.fn.reductions.sum(x)

    def length(self, text: Any) -> Any:
        # DataNode.shape, not fn.shapes: DALI 2.x deprecates fn.shapes
        return text.shape(dtype=self.types.INT64)[0]

    def pow10(self, exponent: Any) -> Any:
        return self.int64(self.math.pow(10.0, self.fn.cast(exponent, dtype=self.types.FLOAT)))
