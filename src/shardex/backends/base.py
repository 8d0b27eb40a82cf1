"""What an export backend implements: writing a split and opening one for reading."""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

from shardex.contract import CONFIG_FILE, FORMAT_VERSION, ExportConfig, FieldSpec, SplitInfo
from shardex.dataset import Dataset, OnReadError, ReopenedDataset
from shardex.errors import BackendError
from shardex.storage.base import Storage

if TYPE_CHECKING:  # for writing only: opening an export imports neither
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from shardex.parallel import Runner

    #: Numbers of samples or bytes, one per sample.
    Ints = npt.NDArray[np.int64]
    from shardex.refs.candidates import Candidates
    from shardex.refs.members import Members
    from shardex.refs.rows import SpilledRows
    from shardex.sample_check import SampleCheck
    from shardex.sources.base import MapRunner
    from shardex.verify_report import VerifyReport


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Facts the CLI and the test suite branch on (never on backend names)."""

    random_access: bool
    streaming: bool
    remote: bool
    append: bool = False  # mode="append" can add shards
    #: Its dataset checks every byte it reads (a re-export needs no other check).
    checked_reads: bool = False
    dali: bool = False  # tar shards with DALI index files
    #: Shards are runs of whole samples that ``TensorShardsLoader`` loads whole.
    shard_windows: bool = False
    bfloat16: bool = False  # stores --dtype bfloat16 fields
    flat_layout: bool = False  # can write layout="flat"


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """One split, ready to write.

    ``candidates``: its samples in order (refs and planned sizes); ``name_hash``: the 12 hex
    digits its shard names share; ``resume``: keep an interrupted export's shards that
    verify; ``previous``: the committed split being appended to.
    """

    split: str
    candidates: SpilledRows
    name_hash: str
    with_label: bool
    fields: tuple[FieldSpec, ...] = ()
    resume: bool = False
    previous: SplitInfo | None = None
    #: Files the committed config.yaml names: readers of it may still use them until the
    #: new one commits, so every new file gets a name none of these use.
    existing: frozenset[str] = frozenset()
    format_version: int = FORMAT_VERSION  # an append keeps what it extends
    samples_per_shard: int = 1000
    max_shard_bytes: int | None = None
    check: SampleCheck = dataclasses.field(default_factory=lambda: _default_check())
    on_skip: Callable[[list[dict[str, str]]], None] | None = None
    flat: bool = False  # layout="flat": files at the output's top level
    #: Set when remote tasks write the shards: where they may stage rows and index arrays
    #: (returning :class:`StagedRows`).
    staging: str | None = None

    @property
    def prefix(self) -> str:
        """``"{split}/"``, or ``""`` in the flat layout."""
        return "" if self.flat else f"{self.split}/"


def _default_check() -> SampleCheck:
    from shardex.sample_check import SampleCheck  # opening an export does not load it

    return SampleCheck()


SECOND: str = ".2"


def unused_name(path: str, taken: frozenset[str]) -> str:
    """``path``, or its second name (``a.npy`` -> ``a.2.npy``) when ``taken`` holds it.

    Replacing exports alternate between the two; the choice depends only on the committed
    config.yaml, so a killed export run again picks the same names.
    """
    if path not in taken:
        return path
    folder, _, name = path.rpartition("/")
    stem, dot, ext = name.partition(".")
    other = f"{stem}{SECOND}{dot}{ext}"
    return f"{folder}/{other}" if folder else other


@dataclass(frozen=True, slots=True)
class StagedRows:
    """A shard's metadata rows staged in the output (see :attr:`SplitPlan.staging`)."""

    part: str
    num_rows: int


class StoredMember(NamedTuple):
    """A stored member: ``size`` bytes at ``offset`` of ``path`` (file or URL), or ``data``."""

    ext: str
    path: str | None
    offset: int
    size: int
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class StoredSample:
    """A committed sample as a re-export reads it, or why it cannot (``invalid``)."""

    key: str
    members: tuple[StoredMember, ...]
    invalid: str | None = None


@dataclass(slots=True)
class Check:
    """Where :meth:`Backend.verify_split` reports; ``deep``: decode every image."""

    report: VerifyReport
    deep: bool
    bar: Any


class ShardDone(Protocol):
    """A written shard as the engine sees it."""

    @property
    def consumed(self) -> int:
        """Candidates taken (written or skipped)."""

    @property
    def complete(self) -> bool:
        """False when candidates ran out before the shard was full: the engine rewrites it."""

    @property
    def num_samples(self) -> int: ...

    @property
    def skipped(self) -> Sequence[dict[str, str]]:
        """errors.parquet rows of the candidates skipped as bad."""


class SplitWriter(ABC):
    """A backend's part in writing one split.

    The engine plans the shards, runs each :meth:`job` with the picklable :attr:`write`
    wherever it decides, and hands each shard back in order: :meth:`add` for kept shards,
    :meth:`discard` for speculative ones replaced; then :meth:`finish` and :meth:`close`.
    """

    write: Callable[[Any], Any]

    @abstractmethod
    def job(self, candidates: Candidates, first_sample: int, number: int) -> Any:
        """The picklable job of new shard ``number``, starting at new sample ``first_sample``."""

    @abstractmethod
    def add(self, done: Any) -> tuple[pa.Table | StagedRows, int]:
        """A kept shard: its metadata rows (or where they are staged) and its bytes."""

    def discard(self, done: Any) -> None:  # noqa: B027  (most backends have nothing to do)
        """A shard written speculatively and then replaced."""

    @abstractmethod
    def finish(self, runner: Runner) -> SplitInfo:
        """Write split-wide files (indexes, key tables); return what config.yaml records."""

    def close(self) -> None:  # noqa: B027  (most backends have nothing to do)
        """Remove what a failed split left; called written or failed."""

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(ABC):
    """An export format: set the class attributes, implement :meth:`sample_sizes` and
    :meth:`split_writer`."""

    name: ClassVar[str]
    description: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    dataset: ClassVar[type[ReopenedDataset]]  # what the default open() builds
    categories: ClassVar[tuple[str, ...]] = ("data-export", "data-loader")
    #: ``--backend-option NAME=VALUE`` names -> what each does.
    option_help: ClassVar[dict[str, str]] = {}
    #: Regexes over every path it writes (second and older names included); anything else
    #: in an output is foreign, and the output is not overwritten or resumed.
    files: ClassVar[tuple[str, ...]] = ()
    #: The prefix of a field's place in key specs (``tar:jpg``); None: the backend's name.
    key_storage: ClassVar[str | None] = None

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        unknown = sorted(set(options or {}) - set(self.option_help))
        if unknown:
            known = ", ".join(sorted(self.option_help)) or "none"
            raise BackendError(
                f"backend {self.name!r} has no option {', '.join(map(repr, unknown))} "
                f"(its options: {known})"
            )
        self.options: dict[str, Any] = dict(options or {})

    @classmethod
    def owns(cls, path: str) -> bool:
        """Whether ``path`` (relative to the export's root) is a file this backend writes."""
        return _any_of(cls.files).fullmatch(path) is not None

    @classmethod
    def field_storage(cls, field: FieldSpec) -> str:
        """Where key specs say ``field``'s values live: ``{key_storage}:{column}``."""
        return f"{cls.key_storage or cls.name}:{field.column}"

    @abstractmethod
    def sample_sizes(
        self, rows: pa.Table, members: Members, member_rows: Ints, *, with_label: bool
    ) -> Ints:
        """The bytes each sample takes in a shard, known before writing (shard boundaries
        and the names' content digest come from these)."""

    @abstractmethod
    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        """The writer of one split; ``remote``: tasks on other machines write its shards."""

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
        """Open a committed split; ``on_error="skip"``: iteration skips damaged samples."""
        return self.dataset(storage, config, split, decode=decode, verify=verify, on_error=on_error)

    @classmethod
    def plain_reader(
        cls, config: ExportConfig, split: str, location: str, storage: Storage
    ) -> str | None:
        """Python that opens the split at ``location`` without shardex (``shardex
        inspect``), or None. Varying path parts are in capitals, with a closing comment
        giving their values (``  # SHARD: 000000 to 000003``)."""
        return None

    @classmethod
    def derived_files(cls, config: ExportConfig, split: str) -> dict[str, bytes]:
        """Files that follow from config.yaml alone (path -> content), written around the
        commit; their names must be in :attr:`files`."""
        return {}

    def verify_split(
        self, storage: Storage, config: ExportConfig, split: str, check: Check
    ) -> None:
        """Check a committed split against config.yaml into ``check.report``."""
        check.report.add(
            CONFIG_FILE,
            "backend",
            f"split {split!r}: the {self.name!r} backend does not say how to verify its "
            "files (it has no verify_split)",
        )

    def stored_samples(
        self, dataset: Dataset, key: Callable[[int], str], runner: MapRunner | None = None
    ) -> Iterator[StoredSample] | None:
        """A committed split's samples for a re-export, as checked byte ranges of its files,
        in order; ``key(n)`` names a damaged one. None: read them through ``dataset``."""
        return None

    def damaged_samples(self, storage: Storage, config: ExportConfig, split: str) -> dict[int, str]:
        """Samples the dataset would return although their bytes differ from the export
        (number -> reason), for a re-export to refuse or skip."""
        return {}


@cache
def _any_of(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns) if patterns else "(?!)")
