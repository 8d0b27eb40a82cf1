"""What an export backend implements: writing a split and opening one for reading."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.contract import FORMAT_VERSION, ExportConfig, FieldSpec, SplitInfo
from shardex.dataset import Dataset, OnReadError, ReopenedDataset
from shardex.errors import BackendError
from shardex.format.shard import SampleCheck, tar_sizes
from shardex.parallel import Runner
from shardex.rows import Members, SplitRows
from shardex.storage.base import Storage


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Facts the CLI and the test suite branch on (never on backend names)."""

    random_access: bool
    streaming: bool
    remote: bool
    #: Whether ``mode="append"`` can add shards to an export of this backend.
    append: bool = False


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """One split, ready to write.

    ``rows`` is the split's scan table in sample order, with ``export_index``,
    ``sample_index`` and (when present) the ``_json`` member text added; ``fields`` are its
    samples' fields (names, kinds, dtypes, shapes, column names); ``bounds`` are the
    row ranges of its shards; ``name_hash`` is the 12 hex digits shared by its shard names;
    ``resume`` keeps shards of an interrupted export that verify; ``previous`` is the
    split as already committed when appending (new shards continue its numbering and the
    index covers old and new samples); ``existing`` are the files the committed
    config.yaml names, which the export must not write (see :func:`unused_name`).
    """

    split: str
    rows: pa.Table
    bounds: tuple[tuple[int, int], ...]
    name_hash: str
    with_label: bool
    fields: tuple[FieldSpec, ...] = ()
    resume: bool = False
    previous: SplitInfo | None = None
    #: Files the committed config.yaml names (an export being replaced or appended to):
    #: nothing may change them before the new config.yaml commits, so a backend writes
    #: every new file under a name none of these use (readers of the old config.yaml
    #: find its files unchanged until they are deleted after the commit).
    existing: frozenset[str] = frozenset()
    #: The export's format version (an append keeps the version of what it extends).
    format_version: int = FORMAT_VERSION
    #: For backends that write shard by shard (:attr:`Backend.writes_shards`): the
    #: split's candidates (``rows`` then holds no members and no ``sample_index``: the
    #: writer numbers the samples it keeps), how shards fill, how images are checked,
    #: and where skipped samples are reported (``bounds`` is then only a first guess).
    candidates: SplitRows | None = None
    samples_per_shard: int = 1000
    max_shard_bytes: int | None = None
    check: SampleCheck = dataclasses.field(default_factory=SampleCheck)
    on_skip: Callable[[list[dict[str, str]]], None] | None = None


#: What goes before the extension of a file's second name (see :func:`unused_name`).
SECOND: str = ".2"


def unused_name(path: str, taken: frozenset[str]) -> str:
    """``path`` (a usual name), or its second name (``index-samples.npy`` -> ``index-samples.2.npy``)
    when the committed export names ``path``. Exports that replace each other alternate
    between the two, and the choice depends only on the committed config.yaml, so a
    killed export run again picks the same names."""
    if path not in taken:
        return path
    folder, _, name = path.rpartition("/")
    stem, dot, ext = name.partition(".")
    other = f"{stem}{SECOND}{dot}{ext}"
    return f"{folder}/{other}" if folder else other


#: Called with each shard's Parquet rows as it completes (metadata.parquet, progress).
OnShard = Callable[[pa.Table], None]


class Backend(ABC):
    """An export format. Subclasses set the class attributes (``dataset``: the reader)
    and implement :meth:`write_split`."""

    name: ClassVar[str]
    description: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    #: The dataset class :meth:`open` builds (or override :meth:`open`).
    dataset: ClassVar[type[ReopenedDataset]]
    #: Categories as NexuML lists them: "data-export", "data-loader".
    categories: ClassVar[tuple[str, ...]] = ("data-export", "data-loader")
    #: Backend options (``--backend-option NAME=VALUE``) -> what each does.
    option_help: ClassVar[dict[str, str]] = {}
    #: Whether :meth:`write_split` writes shard by shard from ``plan.candidates``, checking
    #: each image as it writes it (one pass over the bytes). Otherwise the exporter checks
    #: every image first and gives the split's whole table (``plan.rows``).
    writes_shards: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        unknown = sorted(set(options or {}) - set(self.option_help))
        if unknown:
            known = ", ".join(sorted(self.option_help)) or "none"
            raise BackendError(
                f"backend {self.name!r} has no option {', '.join(map(repr, unknown))} "
                f"(its options: {known})"
            )
        self.options: dict[str, Any] = dict(options or {})

    def sample_sizes(
        self,
        rows: pa.Table,
        members: Members,
        member_rows: npt.NDArray[np.int64],
        *,
        with_label: bool,
    ) -> npt.NDArray[np.int64]:
        """The bytes each sample (``rows``, its members ``member_rows`` of ``members``)
        takes in a shard, known before writing: shard boundaries under
        ``max_shard_bytes`` and the shard names' content digest come from these. The
        default counts them as tar members (headers, data, padding)."""
        return tar_sizes(rows, members, member_rows, with_label=with_label)

    @abstractmethod
    def write_split(
        self, storage: Storage, plan: SplitPlan, runner: Runner, on_shard: OnShard
    ) -> SplitInfo:
        """Write every shard and index file of a split; return what config.yaml records."""

    def open(
        self,
        storage: Storage,
        config: ExportConfig,
        split: str,
        *,
        decode: bool,
        verify: bool,
        on_error: OnReadError = "raise",
    ) -> Dataset:
        """Open a committed split for reading.

        ``on_error="skip"`` makes iteration pass over damaged samples (recorded in
        ``dataset.skipped``) instead of raising. The default builds :attr:`dataset`.
        """
        return self.dataset(storage, config, split, decode=decode, verify=verify, on_error=on_error)
