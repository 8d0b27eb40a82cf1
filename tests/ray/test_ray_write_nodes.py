"""shardex.ray.write_shardex on a real two-node Ray cluster (``ray.cluster_utils.Cluster``,
every service on 127.0.0.1): write tasks stage rows and bytes in the output's storage, Ray
tasks write the shards, the driver handles references and metadata only. Local and S3
outputs (SeaweedFS, no shared file system assumed: the staging is on S3 too); the staging
a killed driver left is removed by the next write."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import shardex
from helpers import RAY_DATA_WARNINGS, assert_same_but_the_source, files_of
from shardex.storage import open_storage
from tests.support.raycluster import ray_nodes
from tests.support.rayrows import (
    LABELS,
    ByProcess,
    RowsSource,
    first_half_slow,
    image_rows,
    local_rows,
)

ray = pytest.importorskip("ray")
ray_data = pytest.importorskip("shardex.ray", exc_type=ImportError)  # no ray: skipped

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
STAGING = ".shardex-staging"

pytestmark = RAY_DATA_WARNINGS


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_nodes(2, cpus_per_node=1) as c:
        yield c


def _objects(url: str, options: dict[str, Any]) -> dict[str, bytes]:
    storage = open_storage(url, options)
    return {p: storage.get(p) for p in storage.list()}


def _dataset(n: int, blocks: int, side: int = 64) -> Any:
    """``n`` samples made by Ray tasks (their bytes are never in this process)."""
    return ray.data.range(n, override_num_blocks=blocks).map_batches(
        image_rows, batch_format="numpy", fn_kwargs={"side": side}
    )


def _io() -> dict[str, int]:
    """This process's I/O counters: ``rchar``/``wchar`` count every read and write
    call's bytes (files and pipes; not socket calls like recv and send)."""
    text = Path("/proc/self/io").read_text()
    return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}


@contextmanager
def _quiet_ray_data() -> Iterator[None]:
    """Ray Data's log lines off (its driver writes a few kB of them per run, whatever the
    data): what is left of the driver's I/O is the export's."""
    logger = logging.getLogger("ray.data")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@pytest.mark.usefixtures("cluster")
def test_same_bytes_whatever_the_blocks_and_write_tasks(tmp_path: Path) -> None:
    n = 60
    shardex.export(RowsSource(local_rows(n)), tmp_path / "direct", samples_per_shard=7)
    expected = files_of(tmp_path / "direct")
    layouts = {
        "one task": _dataset(n, 3).repartition(1),
        "seven tasks": _dataset(n, 3).repartition(7),
        # blocks of the first half finish last: tasks still follow the dataset's order
        "out of order": _dataset(n, 6).map_batches(
            first_half_slow, batch_format="numpy", fn_kwargs={"half": n // 2}, num_cpus=0.5
        ),
    }
    for name, dataset in layouts.items():
        out = tmp_path / name
        config = ray_data.write_shardex(dataset, out, samples_per_shard=7, label_names=LABELS)
        assert config.num_samples == n, name
        # nothing else there: the staging is gone
        assert_same_but_the_source(expected, files_of(out))


@pytest.mark.usefixtures("cluster")
def test_the_driver_reads_and_writes_no_sample_bytes(tmp_path: Path) -> None:
    """/proc/self/io of the driver around write_shardex to a local output: what it reads
    and writes does not grow with the samples' size (references, metadata.parquet, the
    index, the engine's scratch: a few hundred bytes to under 2 kB a sample), so it is a
    vanishing share of large samples. Only this process is counted: the S3 test below
    also counts the processes the driver starts (the previous datasink's local pool)."""
    n = 200
    ray_data.write_shardex(  # a first run: imports and Ray's start-up are not measured
        _dataset(10, 2), tmp_path / "warm", samples_per_shard=16, label_names=LABELS
    )
    moved, data = {}, {}
    for side in (40, 320):
        dataset = _dataset(n, 3, side).repartition(4)
        out = tmp_path / f"side-{side}"
        with _quiet_ray_data():
            before = _io()
            ray_data.write_shardex(dataset, out, samples_per_shard=16, label_names=LABELS)
            after = _io()
        moved[side] = sum(after[k] - before[k] for k in ("rchar", "wchar"))
        data[side] = sum(len(v) for k, v in files_of(out).items() if k.endswith(".tar"))
        print(f"{side}px: driver {moved[side]} bytes = {moved[side] / data[side]:.3%} of shards")
    # not one sample byte: 24x the samples' bytes, the same driver I/O (within 1%)
    assert abs(moved[320] - moved[40]) < (data[320] - data[40]) / 100
    assert moved[320] < 4096 * n  # references and metadata only


@pytest.mark.usefixtures("cluster")
def test_s3_output_stages_on_s3_and_the_driver_moves_under_one_percent(s3: Any) -> None:
    """The S3 requests of the driver and of every process it starts itself, counted at a
    proxy (Ray's workers go to the server directly): under 1% of the samples' bytes at
    100 kB a sample. (The previous datasink, staging locally and writing the shards in a
    local pool, moved 104% there.)"""
    n, side = 120, 320  # about 100 kB a sample
    rows = local_rows(n, side)
    direct_url, ray_url = s3.child("direct"), s3.child("ray")
    shardex.export(RowsSource(rows), direct_url, samples_per_shard=16, storage_options=s3.direct)
    expected = _objects(direct_url, s3.direct)
    sample_bytes = sum(len(b) for b in rows.column("jpg").to_pylist())
    dataset = _dataset(n, 5, side).repartition(4)
    s3.proxy.reset()
    output = ByProcess(ray_url, s3.counted, s3.direct)  # the proxy sees the driver's share
    config = ray_data.write_shardex(dataset, output, samples_per_shard=16, label_names=LABELS)
    s3.proxy.wait_idle()
    assert config.num_samples == n
    # byte-identical, staging gone
    assert_same_but_the_source(expected, _objects(ray_url, s3.direct))
    driver = s3.proxy.requests
    moved = sum(r.body_bytes + r.request_bytes for r in driver)
    print(f"driver: {len(driver)} S3 requests, {moved} bytes = {moved / sample_bytes:.3%}")
    assert moved < sample_bytes / 100
    staged = [r for r in driver if f"/{STAGING}/" in r.target]
    # the driver lists and reads the staged rows and deletes the staging; tasks write it
    assert {r.method for r in staged} <= {"GET", "DELETE"}
    assert not [r for r in staged if r.method == "GET" and r.key.endswith(".bin")]
    assert not [r for r in driver if r.method in ("PUT", "POST") and ".tar" in r.key]


_KILLED_DRIVER = r"""
import json, sys, time
import numpy as np
import ray
from ray._private import ray_constants
ray_constants.ENABLE_RAY_CLUSTER = False
import shardex.ray
from tests.support.rayrows import LABELS, image_rows

address, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ray.init(address=address, log_to_driver=False)


def stall(batch):  # the second block's task never ends: the first one stages meanwhile
    if int(batch["id"][0]) >= 8:
        time.sleep(3600)
    return batch


ds = ray.data.range(16, override_num_blocks=2).map_batches(stall, batch_format="numpy")
ds = ds.map_batches(image_rows, batch_format="numpy")
shardex.ray.write_shardex(ds, out, samples_per_shard=4, label_names=LABELS, storage_options=options)
"""


@pytest.mark.parametrize("where", ["local", "s3"])
def test_staging_of_a_killed_driver_is_removed_by_the_next_write(
    cluster: Any, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        out, options = s3.child("out"), s3.direct
    else:
        out, options = str(tmp_path / "out"), None
    storage = open_storage(out, options)
    env = {**os.environ, "SHARDEX_LOCK_LEASE": "2"}  # its lease on S3 lapses soon
    driver = subprocess.Popen(
        [sys.executable, "-c", _KILLED_DRIVER, cluster.address, out, json.dumps(options)],
        cwd=_REPO_ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.endswith(".parquet") for p in storage.list(f"{STAGING}/")):
            assert driver.poll() is None, "the driver ended before it was killed"
            assert time.monotonic() < deadline, "no write task staged its rows"
            time.sleep(0.2)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert list(storage.list(f"{STAGING}/"))  # the killed run's staging is there
    assert not storage.exists("config.yaml")
    time.sleep(3)  # the killed driver's lease on an S3 output expires
    n = 12
    shardex.export(RowsSource(local_rows(n)), tmp_path / "direct", samples_per_shard=4)
    config = ray_data.write_shardex(
        _dataset(n, 3), out, samples_per_shard=4, label_names=LABELS, storage_options=options
    )
    assert config.num_samples == n
    local = storage.local_path("")
    written = files_of(local) if local else {p: storage.get(p) for p in storage.list()}
    assert not [p for p in written if p.startswith(STAGING)]
    assert_same_but_the_source(files_of(tmp_path / "direct"), written)
