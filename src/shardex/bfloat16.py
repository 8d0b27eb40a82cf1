"""``--dtype bfloat16``: floating-point array fields stored as bfloat16.

numpy has no bfloat16, so inside shardex a bfloat16 column is a ``uint16`` array of bit
patterns. The cast is torch's own (round to nearest even); reading gives ``torch.bfloat16``
tensors back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from shardex.contract import FieldSpec
from shardex.errors import imported

if TYPE_CHECKING:
    import torch

BFLOAT16: Final = "bfloat16"
BITS: Final = np.dtype(np.uint16)


def _torch() -> Any:
    return imported(
        "torch",
        "bfloat16 fields need PyTorch (its cast and its tensors): pip install 'shardex[torch]'",
    )


def mark(specs: Iterable[FieldSpec]) -> tuple[FieldSpec, ...]:
    return tuple(
        dataclasses.replace(s, dtype=BFLOAT16)
        if s.kind == "array" and np.dtype(s.dtype).kind == "f"
        else s
        for s in specs
    )


def is_bfloat16(spec: FieldSpec) -> bool:
    return spec.dtype == BFLOAT16


def storage_dtype(spec: FieldSpec) -> np.dtype[Any]:
    """The numpy dtype of a field's column (bit patterns for bfloat16)."""
    return BITS if is_bfloat16(spec) else np.dtype(spec.dtype)


def bfloat16_columns(layout: Iterable[FieldSpec]) -> frozenset[str]:
    """The columns that hold bfloat16 values."""
    out = set()
    for spec in layout:
        if is_bfloat16(spec):
            out |= {spec.column, f"{spec.column}.data"}
    return frozenset(out)


def to_bits(array: npt.NDArray[Any]) -> npt.NDArray[np.uint16]:
    """Floating-point values cast to bfloat16 as torch casts them, as bit patterns."""
    torch = _torch()
    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(torch.bfloat16)
    return tensor.view(torch.int16).numpy().view(BITS)  # type: ignore[no-any-return]


def as_tensor(bits: Any) -> torch.Tensor:
    """Bit patterns as a ``torch.bfloat16`` tensor sharing their memory (copied when
    read-only: torch tensors may be written to)."""
    torch = _torch()
    array = np.asarray(bits)
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, copy=True)
    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)  # type: ignore[no-any-return]


def from_tensor(tensor: Any) -> npt.NDArray[np.uint16]:
    torch = _torch()
    return tensor.view(torch.int16).numpy().view(BITS)  # type: ignore[no-any-return]


def widened(value: Any) -> npt.NDArray[np.float32]:
    """A bfloat16 tensor as (exact) float32 values, for ``.npy`` bytes."""
    return value.float().numpy()  # type: ignore[no-any-return]
