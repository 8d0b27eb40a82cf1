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
    from shardex.refs.rows import SpilledRows, SplitRows
    from shardex.sample_check import SampleCheck
    from shardex.sources.base import MapRunner
    from shardex.verify_report import VerifyReport


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Facts the CLI and the test suite branch on (never on backend names)."""

    random_access: bool
    streaming: bool
    remote: bool
    #: Whether ``mode="append"`` can add shards to an export of this backend.
    append: bool = False
    #: Whether its dataset checks every byte it reads against a checksum (a re-export then
    #: needs no other check; see :meth:`Backend.damaged_samples`).
    checked_reads: bool = False
    #: Whether its shards are tars with DALI index files (``shardex.dali`` reads them).
    dali: bool = False
    #: Whether its shards are runs of whole samples that ``TensorShardsLoader`` loads whole
    #: (its dataset is an :class:`~shardex.backends.array_dataset.ArrayDataset`).
    shard_windows: bool = False
    #: Whether it stores ``--dtype bfloat16`` fields (see :mod:`shardex.bfloat16`).
    bfloat16: bool = False
    #: Whether it can write a one-split export at the output's top level (``layout="flat"``).
    flat_layout: bool = False


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """One split, ready to write.

    ``candidates`` are the split's samples in order (their references and planned sizes:
    the writers number the samples they keep, skipping bad ones); ``fields`` are its
    samples' fields (names, kinds, dtypes, shapes, column names); ``name_hash`` is the 12
    hex digits shared by its shard names; ``resume`` keeps shards of an interrupted
    export that verify; ``previous`` is the split as already committed when appending
    (new shards continue its numbering and the index covers old and new samples);
    ``existing`` are the files the committed config.yaml names, which the export must not
    write (see :func:`unused_name`).
    """

    split: str
    candidates: SplitRows | SpilledRows
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
    #: How shards fill, how images are checked, and where skipped samples are reported.
    samples_per_shard: int = 1000
    max_shard_bytes: int | None = None
    check: SampleCheck = dataclasses.field(default_factory=lambda: _default_check())
    on_skip: Callable[[list[dict[str, str]]], None] | None = None
    #: ``layout="flat"``: the split's files go to the output's top level (see :attr:`prefix`).
    flat: bool = False
    #: Set when shards are written by tasks on other machines (a remote runner): a
    #: backend may stage each shard's metadata rows and index arrays in the output under
    #: this prefix (see :mod:`shardex.storage.parts`) and hand back a
    #: :class:`StagedRows` instead of the rows.
    staging: str | None = None

    @property
    def prefix(self) -> str:
        """What the paths of the split's files start with: ``"{split}/"``, or ``""`` (flat)."""
        return "" if self.flat else f"{self.split}/"


def _default_check() -> SampleCheck:
    from shardex.sample_check import SampleCheck  # writing code: opening does not load it

    return SampleCheck()


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


@dataclass(frozen=True, slots=True)
class StagedRows:
    """A shard's metadata rows staged in the output (``part``: see :attr:`SplitPlan.staging`)."""

    part: str
    num_rows: int


class StoredMember(NamedTuple):
    """A member of a stored sample: ``size`` bytes at ``offset`` of ``path`` (a local
    file, or an object named by URL), or its bytes themselves (``data``; ``path`` None)."""

    ext: str
    path: str | None
    offset: int
    size: int
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class StoredSample:
    """A sample of a committed export as a re-export reads it: its key and its members,
    or why it cannot be used (``invalid``; then no members)."""

    key: str
    members: tuple[StoredMember, ...]
    invalid: str | None = None


@dataclass(slots=True)
class Check:
    """What :meth:`Backend.verify_split` reports to: the report, whether to decode every
    image (``deep``), and the progress bar to advance by each sample checked."""

    report: VerifyReport
    deep: bool
    bar: Any


class ShardDone(Protocol):
    """A written shard as the engine sees it (a backend's record of it carries more)."""

    @property
    def consumed(self) -> int:
        """Candidates taken (written or skipped) from the job's first one."""

    @property
    def complete(self) -> bool:
        """False when the shard ran out of candidates before it was full (not the split's
        end): the engine discards it and writes it again with more."""

    @property
    def num_samples(self) -> int: ...

    @property
    def skipped(self) -> Sequence[dict[str, str]]:
        """errors.parquet rows of the candidates skipped as bad."""


class SplitWriter(ABC):
    """A backend's part in writing one split. The engine plans the shards, runs each
    job where it decides (in this process or a worker, on this machine or another),
    replans after skipped samples and hands each shard back here in order:

    * :meth:`job` makes the picklable job of one shard from its candidates;
    * :attr:`write` (a picklable callable: a module-level function or a frozen
      dataclass) writes a job and returns its :class:`ShardDone` record;
    * :meth:`add` takes each kept shard that holds samples, and returns its
      metadata.parquet rows (or where they are staged) and the bytes it holds;
    * :meth:`discard` takes each shard written speculatively and then replaced;
    * :meth:`finish` writes what describes the whole split (indexes, key tables) and
      returns what config.yaml records; :meth:`close` removes what a failed split left.
    """

    write: Callable[[Any], Any]

    @abstractmethod
    def job(self, candidates: Candidates, first_sample: int, number: int) -> Any:
        """The job of the split's shard ``number`` (counted from the first new one),
        whose first sample is number ``first_sample`` of the new samples."""

    @abstractmethod
    def add(self, done: Any) -> tuple[pa.Table | StagedRows, int]:
        """A shard kept (in order): its metadata rows, and the bytes it holds."""

    def discard(self, done: Any) -> None:  # noqa: B027  (most backends have nothing to do)
        """A shard written speculatively and then replaced (its files may need deleting)."""

    @abstractmethod
    def finish(self, runner: Runner) -> SplitInfo:
        """The split's closing step, once every shard is added."""

    def close(self) -> None:  # noqa: B027  (most backends have nothing to do)
        """Called when the split ends, written or failed."""

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Backend(ABC):
    """An export format. Subclasses set the class attributes (``dataset``: the reader;
    ``files``: the names of what it writes) and implement :meth:`sample_sizes` and
    :meth:`split_writer`."""

    name: ClassVar[str]
    description: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    #: The dataset class :meth:`open` builds (or override :meth:`open`).
    dataset: ClassVar[type[ReopenedDataset]]
    #: Categories as NexuML lists them: "data-export", "data-loader".
    categories: ClassVar[tuple[str, ...]] = ("data-export", "data-loader")
    #: Backend options (``--backend-option NAME=VALUE``) -> what each does.
    option_help: ClassVar[dict[str, str]] = {}
    #: Every file the backend writes, as regular expressions over its path in the export
    #: (``r"[^/]+/blobs-[0-9a-f]+\.bin"``; a split is the first folder), second names and
    #: names of older versions included. An output that holds anything else (beside the
    #: export's own files) is not overwritten or resumed: it is refused as foreign.
    files: ClassVar[tuple[str, ...]] = ()
    #: What config.yaml's key specs name as a stored field's place, before the colon
    #: (``tar:jpg``); None: the backend's name (``zarr:image``). See :meth:`field_storage`.
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
        """Whether ``path`` (relative to the export's root) is a name this backend writes."""
        return _any_of(cls.files).fullmatch(path) is not None

    @classmethod
    def field_storage(cls, field: FieldSpec) -> str:
        """Where config.yaml's key specs say ``field``'s values live: ``{key_storage}:{column}``
        (a backend that stores fields under their own names overrides it)."""
        return f"{cls.key_storage or cls.name}:{field.column}"

    @abstractmethod
    def sample_sizes(
        self, rows: pa.Table, members: Members, member_rows: Ints, *, with_label: bool
    ) -> Ints:
        """The bytes each sample (``rows``, its members ``member_rows`` of ``members``)
        takes in a shard, known before writing: shard boundaries under
        ``max_shard_bytes`` and the shard names' content digest come from these."""

    @abstractmethod
    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        """The parts that write one split (see :class:`SplitWriter`); ``remote``: its
        shards are written by tasks that may run on other machines (``plan.staging`` is
        then where they can stage what the split's finish step needs)."""

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

    @classmethod
    def plain_reader(
        cls, config: ExportConfig, split: str, location: str, storage: Storage
    ) -> str | None:
        """Python that opens split ``split`` of the export at ``location`` (its root: a
        folder or URL; ``storage`` opens it) with the library its files are made for,
        without shardex (``shardex inspect`` prints it). It must run as printed: None
        where it could not (the default: no single call does). A call over many files
        names the varying part of the path in capitals (``SHARD``, ``COLUMN``) and ends
        with a comment giving each one's values (``  # SHARD: 000000 to 000003``)."""
        return None

    @classmethod
    def derived_files(cls, config: ExportConfig, split: str) -> dict[str, bytes]:
        """Files of a split that follow from config.yaml alone (``path -> content``): the
        ``webdataset`` backend's shard lists. The engine writes them around the commit (see
        :func:`shardex.engine.commit.commit`) and ``shardex verify`` compares them with what
        config.yaml gives; their names must be in :attr:`files`. The default has none."""
        return {}

    def verify_split(
        self, storage: Storage, config: ExportConfig, split: str, check: Check
    ) -> None:
        """Check a committed split byte for byte against config.yaml, adding what is wrong
        to ``check.report`` (``shardex verify``). The default reports that this backend
        cannot be verified."""
        check.report.add(
            CONFIG_FILE,
            "backend",
            f"split {split!r}: the {self.name!r} backend does not say how to verify its "
            "files (it has no verify_split)",
        )

    def stored_samples(
        self, dataset: Dataset, key: Callable[[int], str], runner: MapRunner | None = None
    ) -> Iterator[StoredSample] | None:
        """A committed split's samples for a new export (a re-export) as byte ranges of
        its files (local paths, or object URLs), each read once and checked, in sample
        order, one at a time (``key``: the key of sample number N as the split's metadata
        lists it, to name a damaged one; ``runner``: where the reading may run, a
        :meth:`~shardex.sources.base.Source.stream_on`'s). None (the default): the
        samples are read through ``dataset``, batch by batch."""
        return None

    def damaged_samples(self, storage: Storage, config: ExportConfig, split: str) -> dict[int, str]:
        """Samples of a split that its dataset would return although their bytes differ from
        what was exported (``sample number -> reason``), for a re-export to refuse or skip.
        The default trusts the dataset (its reads are checked: ``capabilities.checked_reads``)."""
        return {}


@cache
def _any_of(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One compiled pattern matching any of ``patterns`` (none: matches nothing)."""
    return re.compile("|".join(f"(?:{p})" for p in patterns) if patterns else "(?!)")
