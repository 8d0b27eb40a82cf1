"""A split's rows of metadata.parquet, as every backend's dataset reads them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from shardex.contract import METADATA_FILE, ExportConfig
from shardex.format.tables import arrow_reader, checked_file, metadata_errors
from shardex.storage.base import Storage


def read_metadata(storage: Storage, config: ExportConfig, split: str) -> pa.Table:
    """A split's metadata.parquet rows in sample order, checked against config.yaml.

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumError: its bytes differ from what was exported.
        FormatError: it is not a Parquet file of the export's columns.
    """
    name = config.metadata_file or METADATA_FILE
    data = checked_file(storage, name, config.metadata_checksum)
    with metadata_errors(storage.join(name)):
        table = pq.read_table(arrow_reader(data), filters=[("split", "=", split)])
        return table.sort_by("sample_index")
