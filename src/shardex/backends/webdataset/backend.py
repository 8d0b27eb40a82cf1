"""The default backend: tar shards + Parquet sidecars + a random-access index (layout:
docs/format.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ClassVar

from shardex.backends.base import Backend, Capabilities, Check, SplitPlan, SplitWriter, StoredSample
from shardex.backends.webdataset.reader import ShardDataset
from shardex.contract import ExportConfig, FieldSpec
from shardex.dataset import Dataset, ReopenedDataset
from shardex.errors import ShardexError
from shardex.storage.base import Storage

if TYPE_CHECKING:  # writing only
    import pyarrow as pa

    from shardex.backends.base import Ints
    from shardex.refs.members import Members
    from shardex.sources.base import MapRunner


class WebDatasetBackend(Backend):
    """Tar shards that stock WebDataset and DALI read, with one-read random access."""

    name: ClassVar[str] = "webdataset"
    description: ClassVar[str] = "tar shards + Parquet + mmap index (default)"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True,
        streaming=True,
        remote=True,
        append=True,
        checked_reads=True,
        dali=True,
        flat_layout=True,
    )
    files: ClassVar[tuple[str, ...]] = (
        # (no folder: the flat layout)
        r"(?:[^/]+/)?images-[0-9a-f]+-\d{6}\.(?:tar|parquet|idx)",
        # (".pending": left by versions that renamed after committing)
        r"(?:[^/]+/)?index-(?:samples|keys|members)(?:\.pending|\.2)?\.npy",
        r"(?:[^/]+/)?shards\.(?:wids\.json|txt)",
    )
    key_storage: ClassVar[str | None] = "tar"
    dataset: ClassVar[type[ReopenedDataset]] = ShardDataset

    @classmethod
    def field_storage(cls, field: FieldSpec) -> str:
        return f"tar:{field.name}"  # a tar member's extension, not a column

    @classmethod
    def plain_reader(
        cls, config: ExportConfig, split: str, location: str, storage: Storage
    ) -> str | None:
        from shardex.backends.webdataset.lists import LIST_FILE, WIDS_FILE

        # wids and webdataset parse a URL: "#" or "?" would cut the path
        if not config.split(split).shards or "#" in location or "?" in location:
            return None
        folder = f"{location}/{config.split_prefix(split)}"
        if _longest_member(storage, config, split) <= 100:
            return f"wids.ShardListDataset({folder + WIDS_FILE!r})"
        # wids reads only ustar's 100-byte name field; webdataset (tarfile) reads long names
        if "://" in location:  # a URL needs webdataset's "pipe:" commands
            return None
        return (
            f"webdataset.WebDataset([{folder!r} + n for n in open({folder + LIST_FILE!r})"
            ".read().split()], shardshuffle=False)"
        )

    @classmethod
    def derived_files(cls, config: ExportConfig, split: str) -> dict[str, bytes]:
        from shardex.backends.webdataset.lists import shard_lists

        return shard_lists(config, split)

    def verify_split(
        self, storage: Storage, config: ExportConfig, split: str, check: Check
    ) -> None:
        from shardex.backends.webdataset.verify import verify_split

        verify_split(storage, config, split, check.report, check.deep, check.bar)

    def stored_samples(
        self, dataset: Dataset, key: Callable[[int], str], runner: MapRunner | None = None
    ) -> Iterator[StoredSample] | None:
        assert isinstance(dataset, ShardDataset)
        from shardex.backends.webdataset.stored import stored_samples

        return stored_samples(dataset, key, runner)

    def sample_sizes(
        self, rows: pa.Table, members: Members, member_rows: Ints, *, with_label: bool
    ) -> Ints:
        from shardex.backends.webdataset.layout import tar_sizes

        return tar_sizes(rows, members, member_rows, with_label=with_label)

    def split_writer(self, storage: Storage, plan: SplitPlan, *, remote: bool) -> SplitWriter:
        from shardex.backends.webdataset.split import TarSplit

        return TarSplit(storage, plan, remote=remote)


def _longest_member(storage: Storage, config: ExportConfig, split: str) -> int:
    """An upper bound on a split's tar member names' length in bytes."""
    import pyarrow.compute as pc

    from shardex.backends.metadata import read_metadata

    try:
        keys = read_metadata(storage, config, split).column("key")
    except ShardexError:
        return 1 << 16
    ext = max([len(f.name.encode()) for f in config.fields] + [len("json")])
    return int(pc.max(pc.binary_length(keys)).as_py() or 0) + 1 + ext
