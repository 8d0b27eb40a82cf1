"""An export split opened lazily, once per process, that pickles as a few names (a
spawned worker reopens it; the index is cached locally).
"""

from __future__ import annotations

import os
from typing import Any

from shardex.api import open_dataset
from shardex.dataset import Dataset, SampleRanges
from shardex.errors import ConfigError, FormatError
from shardex.storage import Storage, open_storage


class DatasetHandle:
    """Opens ``split`` of the export at ``uri`` on first use in each process."""

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
        """The opened split as byte ranges of its shards, or a ConfigError."""
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
            before_fork = getattr(self.storage, "before_fork", None)  # ObjectStorage's
            if before_fork is not None:  # the DataLoader workers forked next request directly
                counted = open_dataset(before_fork(), self.split, verify=False)
                self.split, self._num_samples = counted.split, len(counted)
            else:
                self.dataset()
        assert self._num_samples is not None
        return self._num_samples
