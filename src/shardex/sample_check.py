"""How the shard writer checks each image it reads and words a refusal: a leaf module,
so backends need not import the export's checks and options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shardex.codecs.images import (
    HEAD_BYTES,
    MAX_PIXELS,
    TAIL_BYTES,
    Validate,
    check_decode,
    check_header,
    jpeg_size,
)
from shardex.quoting import quoted

OnError = Literal["error", "skip"]


@dataclass(frozen=True, slots=True)
class SampleCheck:
    """How the writer checks each image it reads, and what a bad one does."""

    validate: Validate = "header"
    max_pixels: int = MAX_PIXELS
    on_error: OnError = "error"


def refusal(original_path: str, reason: str, others: int = 0) -> str:
    """The one-line message refusing a sample."""
    more = f" (and {others} more)" if others else ""
    return f"{quoted(original_path)}: {reason}{more}; fix the source or pass --on-error skip"


def image_problem(data: bytes | memoryview, check: SampleCheck) -> str | None:
    """Why an image member's bytes are not a whole image (``check.validate``), or None."""
    if check.validate == "decode":
        return check_decode(bytes(data), max_pixels=check.max_pixels)
    size = len(data)
    if check.validate == "none":
        return "empty file (0 bytes)" if size == 0 else None
    if size > 4 and data[:3] == b"\xff\xd8\xff" and data[-2:] == b"\xff\xd9":
        # the common case, without copies
        dims = jpeg_size(data, None, size)
        if dims is None or dims[0] * dims[1] <= check.max_pixels:
            return None
    head = bytes(data[:HEAD_BYTES])
    tail = head if size <= HEAD_BYTES else bytes(data[size - TAIL_BYTES :])
    return check_header(
        head, tail, size, read_at=lambda o, n: bytes(data[o : o + n]), max_pixels=check.max_pixels
    )
