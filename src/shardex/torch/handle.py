"""An export split opened lazily, once per process, that pickles as a few names.

DataLoader workers receive datasets by fork (a copy of the parent's memory) or by spawn
(a pickle). A forked worker keeps the opened split: its file descriptors and object-store
client are remade per process by the storage layer. A spawned worker gets only the
storage, the split name and the flags, and opens the split itself (the index is read from
the local cache, so this costs one small GET on object storage).
"""

from __future__ import annotations

import os
from typing import Any

from shardex.api import open_dataset
from shardex.dataset import Dataset, SampleRanges
from shardex.errors import ConfigError, FormatError
from shardex.storage import Storage, open_storage


class DatasetHandle:
    """Opens ``split`` of the export at ``uri`` on first use in each process.

    Args:
        uri: the export's folder or URL (or a Storage).
        split: the split; may be left out when the export has only one.
        storage_options: options for object storage.
        verify: check each sample's checksum as it is read.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str] | Storage,
        split: str | None,
        *,
        storage_options: dict[str, Any] | None = None,
        verify: bool = True,
    ) -> None:
        self.storage = open_storage(uri, storage_options)
        self.split, self.verify = split, verify
        self._num_samples: int | None = None
        self._dataset: Dataset | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "split": self.split,
            "verify": self.verify,
            "num_samples": self._num_samples,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.storage, self.split, self.verify = state["storage"], state["split"], state["verify"]
        self._num_samples, self._dataset = state["num_samples"], None

    def dataset(self) -> Dataset:
        """The opened split (raw bytes, no decoding)."""
        if self._dataset is None:
            ds = open_dataset(self.storage, self.split, verify=self.verify)
            if self._num_samples is not None and len(ds) != self._num_samples:
                raise FormatError(
                    f"split {ds.split!r} of {self.storage.uri} has {len(ds)} samples, but it "
                    f"had {self._num_samples} when this dataset was made: the export was "
                    "replaced; make the dataset again"
                )
            self.split, self._num_samples, self._dataset = ds.split, len(ds), ds
        return self._dataset

    def shards(self) -> SampleRanges:
        """The opened split as byte ranges of its shards (streaming reads runs of them).

        Raises:
            ConfigError: the export's backend does not store samples as byte ranges of
                shards (its dataset is not a :class:`~shardex.dataset.SampleRanges`).
        """
        ds = self.dataset()
        if not isinstance(ds, SampleRanges):
            raise ConfigError(
                f"{self.storage.uri} uses the {ds.config.backend!r} backend, whose samples "
                "are not byte ranges of shards; streaming reads those (the 'webdataset' "
                "backend): use MapDataset for this export"
            )
        return ds

    def __len__(self) -> int:
        if self._num_samples is None:
            self.dataset()
        assert self._num_samples is not None
        return self._num_samples
