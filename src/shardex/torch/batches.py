"""Batches assembled in place and passed from DataLoader workers through reused memory.

torch's ``default_collate`` stacks each worker batch into fresh shared memory (~140 µs of
page faults per 224×224 image; docs/torch.md). A buffer's life::

    worker: take a FREE buffer, mark it BUSY, fill the batch's rows, send (token, id)
    main:   view the buffer (mapped once per worker), hand out tensors over that view
    main:   the last tensor viewing it is freed  ->  mark it FREE   (weakref.finalize)

Past :data:`MAX_BUFFERS` a worker uses torch's fresh memory: kept batches are never reused.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map

import torch
from shardex.errors import ConfigError
from shardex.per_process import PerProcess

#: The FREE/BUSY flag, padded to a cache line so the data is aligned for every dtype.
HEADER: Final = 64
FREE: Final = 0
BUSY: Final = 1
#: Buffers one worker (or the main process) may hold; a batch takes one per tensor field.
MAX_BUFFERS: Final = 32
KEEP_FREE: Final = 8
#: glibc's ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` in workers; see keep_freed_heap.
WORKER_TRIM_BYTES: Final = 64 << 20
WORKER_MMAP_BYTES: Final = 32 << 20

CollateMap = dict[type | tuple[type, ...], Callable[..., Any]]


def collate(batch: list[Any]) -> Any:
    """``default_collate`` (same batches), with worker batches in reused shared memory;
    rows a :class:`RowPacker` made are not copied again. Fits any DataLoader."""
    _check_shapes(batch)
    if get_worker_info() is None:
        return _collate(batch, collate_fn_map=_MAIN_MAP)
    return _collate(batch, collate_fn_map=_worker_pool().collate_map)


def _check_shapes(batch: list[Any], prefix: str = "") -> None:
    """Raise a ConfigError naming the (dotted) field whose items differ in shape; torch's
    own error names no field."""
    if not batch or not isinstance(batch[0], dict):
        return
    for name, first in batch[0].items():
        if isinstance(first, dict):
            _check_shapes([item.get(name) for item in batch], f"{prefix}{name}.")
            continue
        if not isinstance(first, torch.Tensor | np.ndarray):
            continue
        for item in batch[1:]:
            value = item.get(name) if isinstance(item, dict) else None
            if isinstance(value, torch.Tensor | np.ndarray) and value.shape != first.shape:
                raise ConfigError(
                    f"cannot batch the field {prefix + name!r}: its items differ in shape "
                    f"({tuple(first.shape)} and {tuple(value.shape)}); pass a transform= "
                    "that gives every item one shape (images: resize them, see "
                    "docs/torch.md), or a collate_fn that takes items as they are"
                )


@dataclass(eq=False, slots=True)
class _Rows:
    """One tensor field of one batch: ``plain`` (rows, *shape), ``staged`` its worker view."""

    plain: torch.Tensor
    staged: _Staged | None
    row_shape: torch.Size
    dtype: torch.dtype

    def views(self) -> tuple[torch.Tensor, ...]:
        """Every row, tagged; rows refer to this record, not back, so refcount frees it."""
        rows = self.plain.unbind(0)
        for position, row in enumerate(rows):
            row._shardex_rows = (self, position)  # type: ignore[attr-defined]
        return rows


class RowPacker:
    """Copies each item's tensors into rows of batch tensors of ``rows`` rows as the items
    are made (``pack(item)``), which :func:`collate` returns as they are. A value whose
    shape or dtype differs from its batch's first is left alone."""

    def __init__(self, rows: int) -> None:
        self.rows, self.position = rows, 0
        self._fields: dict[str, tuple[_Rows, tuple[torch.Tensor, ...]]] = {}
        self._pool = _worker_pool() if get_worker_info() is not None else None
        self._local = _local_pool() if self._pool is None else None

    def pack(self, item: Any) -> Any:
        if isinstance(item, dict):
            if self.position == 0:
                self._fields = {}
            for name, value in item.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.layout == torch.strided
                    and not value.requires_grad
                ):
                    item[name] = self._row(name, value)
        self.position = (self.position + 1) % self.rows
        return item

    def _row(self, name: str, value: torch.Tensor) -> torch.Tensor:
        packed = self._fields.get(name)
        if packed is None and self.position == 0:
            field = self._batch(value)
            packed = self._fields[name] = (field, field.views())
        if packed is None:
            return value
        field, rows = packed
        if field.row_shape != value.shape or field.dtype != value.dtype:
            return value
        row = rows[self.position]
        row.copy_(value)
        return row

    def _batch(self, value: torch.Tensor) -> _Rows:
        size, dtype = (self.rows, *value.shape), value.dtype
        staged = self._pool.stage(size, dtype) if self._pool is not None else None
        if staged is not None:
            # Row copies go through the plain tensor: an op on a subclass costs a Python call.
            return _Rows(staged.as_subclass(torch.Tensor), staged, value.shape, dtype)
        local = self._local.take(size, dtype) if self._local is not None else None
        plain = torch.empty(size, dtype=dtype) if local is None else local
        return _Rows(plain, None, value.shape, dtype)


def _packed(batch: list[torch.Tensor]) -> torch.Tensor | None:
    """The batch tensor when ``batch`` is its rows 0 .. n-1, in order; else None."""
    tag = getattr(batch[0], "_shardex_rows", None)
    if tag is None or tag[1] != 0:
        return None
    field: _Rows = tag[0]
    for position, tensor in enumerate(batch):
        tag = getattr(tensor, "_shardex_rows", None)
        if tag is None or tag[0] is not field or tag[1] != position:
            return None
    n = len(batch)
    if field.staged is None:
        return field.plain[:n] if n < len(field.plain) else field.plain
    if n == len(field.plain):
        return field.staged
    part = field.plain[:n].as_subclass(_Staged)
    part._shardex_buffer = field.staged._shardex_buffer
    return part


def _main_tensors(batch: list[torch.Tensor], *, collate_fn_map: CollateMap) -> Any:
    packed = _packed(batch)
    if packed is not None:
        return packed
    return default_collate_fn_map[torch.Tensor](batch, collate_fn_map=collate_fn_map)


def _arrays(batch: list[np.ndarray], *, collate_fn_map: CollateMap) -> Any:
    """torch's array collate, less its warning for read-only (mapped) arrays: only read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return default_collate_fn_map[np.ndarray](batch, collate_fn_map=collate_fn_map)


_MAIN_MAP: Final[CollateMap] = {
    **default_collate_fn_map,
    torch.Tensor: _main_tensors,
    np.ndarray: _arrays,
}


def _nbytes(size: tuple[int, ...], dtype: torch.dtype) -> int:
    return dtype.itemsize * int(np.prod(size))


def _page_round(nbytes: int) -> int:
    return -(-nbytes // 4096) * 4096


def _fits(nbytes: int, capacity: int) -> bool:
    """A small field (labels) must not take a big buffer (images) away from its batch."""
    return nbytes <= capacity <= 2 * nbytes + 4096


class _LocalPool:
    """Batch memory of the main process, reused once released (malloc maps big blocks
    anew, faulting every page in): a batch views a fresh array whose finalizer frees it."""

    def __init__(self) -> None:
        self.free: list[npt.NDArray[np.uint8]] = []
        self.busy = 0
        # Loaders may run in several threads; a finalizer may run inside take() (a GC).
        self.lock = threading.RLock()

    def take(self, size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        nbytes = _nbytes(size, dtype)
        if not nbytes:
            return None
        with self.lock:
            at = next((i for i, b in enumerate(self.free) if _fits(nbytes, len(b))), None)
            if at is None and self.busy >= MAX_BUFFERS:
                return None
            block = (
                np.empty(_page_round(nbytes), dtype=np.uint8) if at is None else self.free.pop(at)
            )
            self.busy += 1
        data = block[:nbytes]
        weakref.finalize(data, self._release, block)
        return torch.from_numpy(data).view(dtype).view(size)

    def _release(self, block: npt.NDArray[np.uint8]) -> None:
        with self.lock:
            self.busy -= 1
            if len(self.free) < KEEP_FREE:
                self.free.append(block)


_local_pool: Final = PerProcess(_LocalPool)


class _Staged(torch.Tensor):
    """A batch tensor in a worker's buffer; it pickles as (worker token, buffer id)."""

    _shardex_buffer: _Buffer


class _Buffer:
    """One reusable shared buffer of a worker."""

    def __init__(self, ident: int, capacity: int) -> None:
        self.ident, self.capacity = ident, capacity
        self.storage = torch.UntypedStorage._new_shared(HEADER + capacity)  # type: ignore[no-untyped-call]
        whole = torch.empty(0, dtype=torch.uint8).set_(self.storage)
        self.flag: npt.NDArray[np.uint8] = whole[:HEADER].numpy()
        self.sent = False  # the main process has been given the storage itself

    def fits(self, nbytes: int) -> bool:
        return int(self.flag[0]) == FREE and _fits(nbytes, self.capacity)


def glibc() -> bool:
    """Whether this process runs on glibc."""
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # no such name here (not glibc)
        return False


def keep_freed_heap() -> bool:
    """Makes glibc keep freed heap memory of this process for reuse; False if not glibc.

    glibc trims the heap top past ~256 KB free, so a worker decoding images faulted its
    pages in again per image (11k-29k faults per 2,500 images; ~9k with this)."""
    if not glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    # M_MMAP_THRESHOLD is -3, M_TRIM_THRESHOLD is -1 (malloc.h); each returns 1 on success.
    return bool(mallopt(-3, WORKER_MMAP_BYTES)) and bool(mallopt(-1, WORKER_TRIM_BYTES))


class _WorkerPool:
    """This worker process's buffers, and the collate map that stacks into them."""

    def __init__(self) -> None:
        keep_freed_heap()
        ForkingPickler.register(_Staged, _reduce_staged)
        self.token = f"{os.getpid()}-{os.urandom(6).hex()}"
        self.buffers: list[_Buffer] = []
        self.collate_map: CollateMap = {
            **default_collate_fn_map,
            torch.Tensor: self._tensors,
            np.ndarray: _arrays,
            int: self._numbers,  # and bool, by isinstance
            float: self._numbers,
        }

    def stage(self, size: tuple[int, ...], dtype: torch.dtype) -> _Staged | None:
        """An uninitialised tensor in a buffer now BUSY, or None (empty, or none free)."""
        nbytes = _nbytes(size, dtype)
        buffer = self._take(nbytes) if nbytes else None
        if buffer is None:
            return None
        whole = torch.empty(0, dtype=torch.uint8).set_(buffer.storage)
        staged = whole[HEADER : HEADER + nbytes].view(dtype).view(size).as_subclass(_Staged)
        staged._shardex_buffer = buffer
        return staged

    def _take(self, nbytes: int) -> _Buffer | None:
        buffer = next((b for b in self.buffers if b.fits(nbytes)), None)
        if buffer is None and len(self.buffers) < MAX_BUFFERS:
            buffer = _Buffer(len(self.buffers), _page_round(nbytes))
            self.buffers.append(buffer)
        if buffer is not None:
            buffer.flag[0] = BUSY
        return buffer

    def _tensors(self, batch: list[torch.Tensor], *, collate_fn_map: CollateMap) -> Any:
        packed = _packed(batch)
        if packed is not None:
            return packed
        elem = batch[0]
        plain = (
            elem.layout == torch.strided
            and not elem.is_nested
            and elem.device.type == "cpu"
            and all(t.dtype == elem.dtype and t.shape == elem.shape for t in batch)
        )
        out = self.stage((len(batch), *elem.shape), elem.dtype) if plain else None
        if out is None:
            return default_collate_fn_map[torch.Tensor](batch, collate_fn_map=collate_fn_map)
        torch.stack(batch, 0, out=out.as_subclass(torch.Tensor))
        return out

    def _numbers(self, batch: list[float], *, collate_fn_map: CollateMap) -> Any:
        float64 = isinstance(batch[0], float)  # as default_collate: ints and bools as they are
        values = torch.tensor(batch, dtype=torch.float64 if float64 else None)
        out = self.stage(tuple(values.shape), values.dtype)
        if out is None:
            return values
        out.as_subclass(torch.Tensor).copy_(values)
        return out


#: This process's pool, made on first use (a forked worker never inherits one).
_worker_pool: Final = PerProcess(_WorkerPool)


def _reduce_staged(tensor: _Staged) -> tuple[Any, ...]:
    buffer = getattr(tensor, "_shardex_buffer", None)
    plain = tensor.as_subclass(torch.Tensor)
    if (
        buffer is None
        or not plain.is_contiguous()
        or plain.data_ptr() != buffer.storage.data_ptr() + HEADER
    ):  # a tensor computed from a batch tensor: torch's own way
        reduced: tuple[Any, ...] = reduce_tensor(plain)  # type: ignore[no-untyped-call]
        return reduced
    storage = None if buffer.sent else buffer.storage
    buffer.sent = True
    token = _worker_pool().token
    return (_rebuild_staged, (token, buffer.ident, storage, plain.dtype, tuple(plain.shape)))


# token -> buffer id -> bytes; a handed-out tensor keeps its own memory alive.
_MAPPED: dict[str, dict[int, npt.NDArray[np.uint8]]] = {}
_MAPPED_LOCK = threading.Lock()  # the pin_memory thread unpickles batches too


def _rebuild_staged(
    token: str,
    ident: int,
    storage: torch.UntypedStorage | None,
    dtype: torch.dtype,
    shape: tuple[int, ...],
) -> torch.Tensor:
    with _MAPPED_LOCK:
        if token not in _MAPPED:
            _forget_exited_workers()
            _MAPPED[token] = {}
        buffers = _MAPPED[token]
        if storage is not None:
            buffers[ident] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        whole = buffers[ident]
    # A fresh array per batch: its finalizer runs when the last tensor viewing it goes.
    data = whole[HEADER : HEADER + _nbytes(shape, dtype)]
    weakref.finalize(data, _release, whole)
    return torch.from_numpy(data).view(dtype).view(shape)


def _release(whole: npt.NDArray[np.uint8]) -> None:
    whole[0] = FREE


def _forget_exited_workers() -> None:
    for token in list(_MAPPED):
        try:
            os.kill(int(token.partition("-")[0]), 0)
        except (ProcessLookupError, PermissionError):  # exited (the number may be reused)
            del _MAPPED[token]
