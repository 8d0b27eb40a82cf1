"""One member name for every sample's image (``image_member``), whatever its format.

Third-party WebDataset readers make one column per member extension: an export whose
samples are ``.jpg``, ``.png`` and ``.webp`` gives Hugging Face ``datasets`` and Ray Data
three sparse image columns (a ValueError, rows without their image, or a failed cast).
With ``image_member="jpg"`` every image is stored as ``KEY.jpg``; the bytes are kept as
they are (no re-encoding) and each sample's real format goes to the ``image_format``
metadata column (``jpeg``, ``png``, ``webp`` ...). This works because every reader that
matters decodes by content once it knows a member is an image: Pillow (datasets, Ray,
webdataset, wids), DALI's decoders and shardex's own :func:`shardex.codecs.images.decode`
all look at the bytes, not at the name.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from shardex.codecs.images import IMAGE_EXTENSIONS, encoding_of_extension
from shardex.errors import ConfigError
from shardex.quoting import quoted
from shardex.refs.scan import MEMBER_TYPE, MEMBERS

#: The metadata column that keeps each sample's image format.
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
    """``table`` with each sample's image member (an extension such as ``png``, not a
    dotted name such as ``mask.png``) renamed ``member``, and an ``image_format`` column;
    ``table`` itself when ``member`` is None.

    Raises:
        ConfigError: the source has an ``image_format`` column already, or a sample holds
            more than one image member (they would get the same name).
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
    """One chunk renamed: (its members, each sample's image format, images per sample)."""
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


#: The member extension a re-export gives back to each image format.
_EXTENSION_OF: Final = {"jpeg": "jpg", "tiff": "tif"}


def original_extension(image_format: str | None, member: str) -> str:
    """The extension an ``image_member`` export's image takes back when it is re-exported
    (``png`` for a PNG stored as ``KEY.jpg``); ``member`` where the format is unknown."""
    if not image_format:
        return member
    ext = _EXTENSION_OF.get(image_format, image_format)
    return ext if ext in IMAGE_EXTENSIONS else member
