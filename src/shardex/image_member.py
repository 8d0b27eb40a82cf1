"""One member name for every sample's image (``image_member``), whatever its format.

Readers that make one column per member extension (Hugging Face ``datasets``, Ray Data)
choke on mixed ``.jpg``/``.png``; with ``image_member="jpg"`` every image is ``KEY.jpg``,
bytes unchanged, its real format in the ``image_format`` column. Every reader that matters
decodes by content, not by name.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import EXTENSION_OF, IMAGE_EXTENSIONS, encoding_of_extension
from shardex.errors import ConfigError
from shardex.quoting import quoted
from shardex.refs.scan import MEMBER_TYPE, MEMBERS

IMAGE_FORMAT: Final = "image_format"


def image_member_problem(name: str) -> str | None:
    """Why ``name`` cannot be the one image member name (None when it can)."""
    if name not in IMAGE_EXTENSIONS:
        names = ", ".join(sorted(IMAGE_EXTENSIONS))
        return (
            f"image_member must be an image extension readers decode by content ({names}), "
            f"got {quoted(name)}; 'jpg' is what most readers expect"
        )
    return None


def one_image_member(table: pa.Table, member: str | None) -> pa.Table:
    """``table`` with each sample's image member (``png``, not ``mask.png``) renamed
    ``member``, plus an ``image_format`` column.

    Raises:
        ConfigError: the source has an ``image_format`` column, or a sample holds more
            than one image member.
    """
    if member is None or MEMBERS not in table.column_names:
        return table
    if IMAGE_FORMAT in table.column_names:
        raise ConfigError(
            f"image_member needs the metadata column {IMAGE_FORMAT!r} for each image's "
            f"format, and the source has a column of that name: rename it in the source"
        )
    column = table.column(MEMBERS)
    lists, formats, seen = [], [], 0
    for chunk in column.chunks:
        renamed, fmt, counts = _rename(chunk, member)
        if (counts > 1).any():
            row = seen + int(np.flatnonzero(counts > 1)[0])
            key = table.column("key")[row].as_py()
            raise ConfigError(
                f"sample {quoted(str(key))} has {int(counts.max())} image members; with "
                "image_member each sample may hold one image (export the others under "
                "names such as NAME.png, or leave image_member out)"
            )
        lists.append(renamed)
        formats.append(fmt)
        seen += len(chunk)
    index = table.column_names.index(MEMBERS)
    table = table.set_column(index, MEMBERS, pa.chunked_array(lists, column.type))
    return table.append_column(IMAGE_FORMAT, pa.chunked_array(formats, pa.string()))


def _rename(
    chunk: pa.ListArray, member: str
) -> tuple[pa.ListArray, pa.Array, npt.NDArray[np.int64]]:
    """(the chunk renamed, each sample's image format, images per sample)."""
    fields = chunk.values.flatten()  # the members' fields (struct offsets applied)
    ext = fields[0]
    is_image = pc.fill_null(
        pc.is_in(pc.utf8_lower(ext), value_set=pa.array(sorted(IMAGE_EXTENSIONS))), False
    ).to_numpy(zero_copy_only=False)
    # each member's sample: values outside the chunk's slice, or under a null, belong to none
    offsets = chunk.offsets.to_numpy()
    owner = np.searchsorted(offsets, np.arange(len(ext)), side="right") - 1
    inside = (owner >= 0) & (owner < len(chunk))
    owner = np.where(inside, owner, 0)
    valid = np.append(chunk.is_valid().to_numpy(zero_copy_only=False), False)
    images = is_image & inside & valid[owner]
    counts = np.bincount(owner[images], minlength=len(chunk))
    fmt = np.full(len(chunk), None, dtype=object)
    image_exts = ext.filter(pa.array(images)).to_pylist()
    fmt[owner[images]] = [encoding_of_extension(e) for e in image_exts]
    children = [pc.if_else(pa.array(images), member, ext), *fields[1:]]
    struct = pa.StructArray.from_arrays(children, fields=list(MEMBER_TYPE))
    # fresh offsets: Arrow takes no validity mask with the offsets of a sliced array
    renamed = pa.ListArray.from_arrays(pa.array(offsets), struct, mask=chunk.is_null())
    return renamed, pa.array(fmt, pa.string()), counts


def original_extension(image_format: str | None, member: str) -> str:
    """The extension an image takes back when re-exported (``png`` for a PNG as ``KEY.jpg``)."""
    if not image_format:
        return member
    ext = EXTENSION_OF.get(image_format, image_format)
    return ext if ext in IMAGE_EXTENSIONS else member
