"""``export-dataset --executor ray`` on a real local Ray cluster of one and two nodes
(raylets on 127.0.0.1): shards written by Ray tasks, pass 1 streamed by the driver,
output byte-identical to the local executor's and to one worker's, from a folder and
from SeaweedFS, to a folder and to SeaweedFS."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

import shardex
from helpers import files_of, make_tree, write_image
from shardex.cli import main
from shardex.engine.spill import FinalSpill
from shardex.errors import BadSampleError, ConfigError
from shardex.refs.scan import MEMBER_TYPE, MEMBERS
from shardex.storage import ObjectStorage
from tests.support.raycluster import ray_nodes, record_span, slice_read
from tests.support.s3data import S3Location

pytest.importorskip("ray")

RELS = [
    f"{split}/{cls}/img{i:02d}.jpg"
    for split in ("train", "val")
    for cls in ("cat", "dog", "owl")
    for i in range(9)
]
FLAGS = ["-q", "--samples-per-shard", "4", "--seed", "3"]


@pytest.fixture(scope="module", params=[1, 2], ids=["1-node", "2-nodes"])
def cluster(request: pytest.FixtureRequest) -> Iterator[int]:
    with ray_nodes(nodes=request.param, cpus_per_node=1):
        yield request.param


def _cli(*args: str, env: dict[str, str] | None = None) -> None:
    result = CliRunner().invoke(main, ["export-dataset", *args], env=env)
    assert result.exit_code == 0, result.output


def _object_files(url: str, options: dict[str, Any]) -> dict[str, bytes]:
    storage = ObjectStorage(url, options)
    return {name: storage.get(name) for name in sorted(storage.list())}


def test_a_folder_exports_the_same_bytes_on_ray_as_locally(cluster: int, tmp_path: Path) -> None:
    make_tree(tmp_path / "src", RELS)
    src = str(tmp_path / "src")
    _cli(src, "-o", str(tmp_path / "ray"), "--executor", "ray", *FLAGS)
    _cli(src, "-o", str(tmp_path / "two"), "--workers", "2", *FLAGS)
    _cli(src, "-o", str(tmp_path / "one"), "--workers", "1", *FLAGS)
    # the same from Python
    shardex.export(src, tmp_path / "api", samples_per_shard=4, seed=3, executor="ray")
    ray, two, one, api = (files_of(tmp_path / n) for n in ("ray", "two", "one", "api"))
    assert ray == two == one == api  # every file, config.yaml included
    assert not (tmp_path / "ray" / ".shardex-staging").exists()  # the parts' folder too
    assert sum(name.endswith(".tar") for name in ray) == 14  # 27 + 27 samples, 4 a shard
    ds = shardex.open_dataset(tmp_path / "ray", split="val")
    assert len(ds) == 27


def _io_bytes() -> int:
    """Bytes this process has read and written through files and pipes (/proc/self/io)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def test_the_driver_reads_and_writes_no_image_bytes(cluster: int, tmp_path: Path) -> None:
    rels = [f"train/c{i % 3}/big{i:02d}.png" for i in range(24)]
    for i, rel in enumerate(rels):  # noise PNGs: about 100 KB each, 2.4 MB in all
        write_image(tmp_path / "src" / rel, 100 + i, size=(190, 180))
    data = sum(p.stat().st_size for p in (tmp_path / "src").rglob("*.png"))
    src = str(tmp_path / "src")
    _cli(src, "-o", str(tmp_path / "warm"), "--executor", "ray", *FLAGS)  # imports done
    before = _io_bytes()
    _cli(src, "-o", str(tmp_path / "ray"), "--executor", "ray", *FLAGS)
    moved = _io_bytes() - before
    # the tasks read every image and wrote every shard: 2x the data on their side
    assert sum(p.stat().st_size for p in (tmp_path / "ray").rglob("*.tar")) > data
    assert moved < 0.05 * data, f"the driver moved {moved} bytes of a {data}-byte dataset"


def test_s3_and_folder_sources_to_s3_and_to_a_folder_on_ray_equal_the_local_executor(
    cluster: int, s3: S3Location, tmp_path: Path
) -> None:
    files = make_tree(tmp_path / "src", RELS)
    storage = ObjectStorage(s3.child("src"), s3.direct)
    for name, data in files.items():
        storage.put(name, data)
    env = {"AWS_ACCESS_KEY_ID": s3.server.access_key, "AWS_SECRET_ACCESS_KEY": s3.server.secret_key}
    s3_flags = ["--s3-endpoint-url", s3.server.endpoint, "--s3-region", s3.server.region]
    source_flags = [f"--source-{flag[2:]}" if flag.startswith("--") else flag for flag in s3_flags]
    src = s3.child("src/")
    ray_out, local_out = s3.child(f"ray-{cluster}"), s3.child(f"local-{cluster}")
    _cli(src, "-o", ray_out, "--executor", "ray", *s3_flags, *FLAGS, env=env)
    _cli(src, "-o", local_out, "--workers", "2", *s3_flags, *FLAGS, env=env)
    # the source's own flags (its store differs from the output's)
    _cli(src, "-o", str(tmp_path / "ray"), "--executor", "ray", *source_flags, *FLAGS, env=env)
    _cli(src, "-o", str(tmp_path / "one"), "--workers", "1", *source_flags, *FLAGS, env=env)
    on_ray = _object_files(ray_out, s3.direct)
    assert on_ray == _object_files(local_out, s3.direct)
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one") == on_ray
    assert shardex.read_config(ray_out, s3.direct).num_samples == len(RELS)
    # a local folder to S3
    folder, folder_out = str(tmp_path / "src"), s3.child(f"folder-{cluster}")
    _cli(folder, "-o", folder_out, "--executor", "ray", *s3_flags, *FLAGS, env=env)
    _cli(folder, "-o", str(tmp_path / "folder"), "--workers", "2", *FLAGS)
    assert _object_files(folder_out, s3.direct) == files_of(tmp_path / "folder")


def test_the_driver_neither_reads_the_staged_parts_nor_writes_the_index(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shard tasks stage each shard's metadata rows and index arrays in the output, and
    tasks merge them into the index files and metadata.parquet: the driver (this process;
    Ray's tasks run in others) reads no part and writes none of those files. A part a
    killed run left is removed; the run's own parts are gone once it commits."""
    import shardex.engine.run as run

    make_tree(tmp_path / "src", RELS)
    src = str(tmp_path / "src")
    out = s3.child(f"out-{cluster}")
    storage = ObjectStorage(out, s3.direct)
    killed = ".shardex-staging/0123456789ab/part-0123456789abcdef.npz"
    storage.put(killed, b"a part of a killed run")
    calls: list[tuple[str, str]] = []
    for method in ("get", "get_range", "get_ranges", "iter_chunks", "put", "open_writer"):
        real = getattr(ObjectStorage, method)

        def spy(self: ObjectStorage, path: str, *a: Any, _m: str = method, _r: Any = real) -> Any:
            calls.append((_m, path))
            return _r(self, path, *a)

        monkeypatch.setattr(ObjectStorage, method, spy)
    staged: list[str] = []
    real_remove = run.remove_staging

    def remove_staging(storage: Any, staging: str) -> None:
        staged.extend(storage.list(staging))  # what the tasks staged, before it goes
        real_remove(storage, staging)

    monkeypatch.setattr(run, "remove_staging", remove_staging)
    shardex.export(src, out, samples_per_shard=4, seed=3, executor="ray", storage_options=s3.direct)
    monkeypatch.undo()
    shards = [n for n in _object_files(out, s3.direct) if n.endswith(".tar")]
    assert len(staged) == len(shards) == 14  # one part a shard, staged by its task
    read = [p for m, p in calls if m.startswith(("get", "iter")) and ".shardex-staging/" in p]
    assert read == []
    wrote = [p for m, p in calls if m in ("put", "open_writer")]
    assert [p for p in wrote if "index-" in p or "metadata" in p or "staging" in p] == []
    assert [n for n in storage.list() if n.startswith(".shardex-staging/")] == []
    shardex.export(src, tmp_path / "local", samples_per_shard=4, seed=3, workers=2)
    assert _object_files(out, s3.direct) == files_of(tmp_path / "local")


def test_tars_on_s3_are_scanned_by_the_tasks_not_the_driver(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scanning a tar on object storage reads its headers (and its small members): on Ray
    the tasks scan, or every tar would pass through the driver. The scan is counted in
    this process only (the tasks' processes import the module afresh)."""
    import io
    import tarfile

    from shardex.sources import tars as tars_module

    files = make_tree(tmp_path / "imgs", RELS)
    storage = ObjectStorage(s3.child("tars"), s3.direct)
    for split in ("train", "val"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel, data in files.items():
                if rel.startswith(split):
                    info = tarfile.TarInfo(rel.replace("/", "_"))
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        storage.put(f"{split}.tar", buf.getvalue())
    scanned_here: list[object] = []
    real = tars_module.tar_samples

    def counted(tar: Any) -> Any:
        scanned_here.append(tar)
        return real(tar)

    monkeypatch.setattr(tars_module, "tar_samples", counted)
    env = {"AWS_ACCESS_KEY_ID": s3.server.access_key, "AWS_SECRET_ACCESS_KEY": s3.server.secret_key}
    flags = ["--source-s3-endpoint-url", s3.server.endpoint, "--source-s3-region", s3.server.region]
    src = s3.child("tars/")
    _cli(src, "-o", str(tmp_path / "ray"), "--executor", "ray", *flags, *FLAGS, env=env)
    assert scanned_here == []  # every tar scanned by a task
    _cli(src, "-o", str(tmp_path / "one"), "--workers", "1", *flags, *FLAGS, env=env)
    assert len(scanned_here) == 2  # the local executor scans here (threads)
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one")
    assert shardex.read_config(tmp_path / "ray").num_samples == len(RELS)


def test_an_image_folder_on_s3_is_listed_by_the_tasks_not_the_driver(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folders of an image-folder prefix are probed and listed by tasks (the driver
    makes only the LISTs of folders, and gets compact key tables back); the output is
    the local executor's. Listings of objects are counted in this process only."""
    files = make_tree(tmp_path / "src", RELS)
    storage = ObjectStorage(s3.child("imgs"), s3.direct)
    for name, data in files.items():
        storage.put(name, data)
    listed_here: list[str] = []
    real = ObjectStorage.list_pages

    def counted(self: ObjectStorage, *args: Any) -> Any:
        listed_here.append(self.uri)
        return real(self, *args)

    monkeypatch.setattr(ObjectStorage, "list_pages", counted)
    env = {"AWS_ACCESS_KEY_ID": s3.server.access_key, "AWS_SECRET_ACCESS_KEY": s3.server.secret_key}
    flags = ["--source-s3-endpoint-url", s3.server.endpoint, "--source-s3-region", s3.server.region]
    src = s3.child("imgs/")
    _cli(src, "-o", str(tmp_path / "ray"), "--executor", "ray", *flags, *FLAGS, env=env)
    # one page read here, by open_source, to tell tars from images; every folder probed
    # and listed by a task
    assert len(listed_here) == 1
    _cli(src, "-o", str(tmp_path / "one"), "--workers", "1", *flags, *FLAGS, env=env)
    assert len(listed_here) > 1 + 2 + 6  # the local executor probes the folders here
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "one")


def test_workers_caps_the_ray_tasks_running_at_once(cluster: int, tmp_path: Path) -> None:
    from shardex.pipeline.ray_executor import RayExecutor, RayRunner

    with RayRunner(RayExecutor(), limit=1) as runner:
        assert list(runner.imap(record_span, [(str(tmp_path), i) for i in range(4)])) == [
            0,
            1,
            2,
            3,
        ]
    spans = sorted(tuple(map(float, p.read_text().split())) for p in tmp_path.iterdir())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one at a time
    with RayRunner(RayExecutor()) as runner:
        assert runner.workers == cluster  # one per cluster CPU (1 a node here)


def _file_rows(keys: list[str]) -> pa.Table:
    """Final rows of samples ``keys``, each a JPEG file ``/data/KEY.jpg`` of 7 bytes."""
    members = pa.array(
        [[{"ext": "jpg", "path": f"/data/{k}.jpg", "offset": -1, "size": 7}] for k in keys],
        pa.list_(MEMBER_TYPE),
    )
    return pa.table({"key": keys, MEMBERS: members})


def test_a_carried_slice_needs_nothing_from_the_drivers_disk(tmp_path: Path) -> None:
    """What a remote task gets: its reference rows in the job (no sample bytes), so the
    spill file on the driver's scratch is not read."""
    n = 3000
    keys = [f"k{i:04d}" for i in range(n)]
    table = _file_rows(keys)
    spill = FinalSpill(tmp_path, "train", table.schema)
    spill.append(table, np.full(n, 1536, np.int64))
    part = spill.close().slice(1000, 2500)  # spans two record batches
    expected_rows, _ = part.read()
    carried = part.carried()
    os.remove(part.path)  # a task on another machine does not see this scratch
    rows, got = carried.read()
    assert rows.column("key").to_pylist() == keys[1000:2500] == expected_rows["key"].to_pylist()
    assert [got.path(j) for j in range(1500)] == [f"/data/{k}.jpg" for k in keys[1000:2500]]
    assert carried.rows_ipc is not None
    assert len(carried.rows_ipc) < 40 * 1500  # references, a few bytes each once packed
    with pytest.raises(FileNotFoundError):
        part.read()


def test_rows_in_the_object_store_reach_the_tasks_and_no_job_carries_them(
    cluster: int, tmp_path: Path
) -> None:
    """A remote runner's final rows go to Ray's object store as they are made (no spill
    file on the driver's scratch): a job carries handles of a few bytes, the task on any
    node fetches its slice and the planned sizes with it."""
    import pickle

    from shardex.pipeline import RayExecutor
    from shardex.pipeline.ray_executor import RayRunner

    n = 3000
    keys = [f"k{i:04d}" for i in range(n)]
    table = _file_rows(keys)
    sizes = np.arange(n, dtype=np.int64) + 1536
    with RayRunner(RayExecutor()) as runner:
        spill = FinalSpill(tmp_path, "train", table.schema, put=runner.put)
        spill.append(table, sizes)
        rows = spill.close()
        assert not os.path.exists(rows.path)  # nothing on the driver's scratch
        parts = [rows.slice(1000, 2500), rows.slice(0, 8), rows.slice(2990, 3000)]
        assert all(len(pickle.dumps(p)) < 1500 for p in parts)  # handles, not 1,500 rows
        got = list(runner.imap(slice_read, parts))
    assert [g[0] for g in got] == [keys[1000:2500], keys[0:8], keys[2990:3000]]
    assert [g[1] for g in got] == [
        sizes[1000:2500].tolist(),
        sizes[0:8].tolist(),
        sizes[2990:3000].tolist(),
    ]
    assert all(g[2] != os.getpid() for g in got)  # read in Ray's workers


def test_an_unknown_executor_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^executor must be 'local' or 'ray', got 'spark'$"):
        shardex.export("demo:4", tmp_path / "out", executor="spark")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def _wait_for_idle_workers(limit: float = 60.0) -> None:
    """Return once no Ray worker of this process's cluster runs a task (Ray titles a
    worker ``ray::IDLE`` between tasks) for half a second in a row."""
    import psutil

    def busy() -> bool:
        for proc in psutil.Process().children(recursive=True):
            try:
                name = (proc.cmdline() or [""])[0]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if name.startswith("ray::") and name != "ray::IDLE" and not name.endswith("Agent"):
                return True
        return False

    deadline = time.monotonic() + limit
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 0.5:
        assert time.monotonic() < deadline, f"Ray's workers still busy after {limit:.0f}s"
        if busy():
            idle_since = time.monotonic()
        time.sleep(0.02)


def test_a_refused_sample_leaves_no_shard_written_by_tasks_still_running(
    cluster: int, tmp_path: Path
) -> None:
    # the first sample is bad: its shard fails at once while later shards are in flight
    src = tmp_path / "src"
    whole = write_image(src / "a_broken.jpg", 1, size=(64, 64))
    (src / "a_broken.jpg").write_bytes(whole[: len(whole) // 2])
    for i in range(240):  # noise PNGs: each shard takes a while to check and write
        write_image(src / f"b{i:03d}.png", 10 + i, size=(120, 120))
    out = tmp_path / "out"
    with pytest.raises(BadSampleError):
        shardex.export(src, out, samples_per_shard=30, executor="ray")
    _wait_for_idle_workers()  # were tasks still writing, their shards would be out by now
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != ".shardex-lock"]


def test_a_refused_sample_on_ray_is_one_error_line(cluster: int, tmp_path: Path) -> None:
    make_tree(tmp_path / "src", [f"img{i}.jpg" for i in range(6)])
    whole = write_image(tmp_path / "src" / "broken.jpg", 1, size=(64, 64))
    (tmp_path / "src" / "broken.jpg").write_bytes(whole[: len(whole) // 2])
    result = CliRunner().invoke(
        main,
        [
            "export-dataset",
            str(tmp_path / "src"),
            "-o",
            str(tmp_path / "out"),
            "-q",
            "--executor",
            "ray",
            "--samples-per-shard",
            "2",
        ],
    )
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "broken.jpg" in lines[0], lines[0]


def _members(data: bytes) -> list[Any]:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return tf.getmembers()


def _tars_to_hold(kind: str) -> dict[str, bytes]:
    """Three tars whose members the scan reads through, each with more than
    ``held.MIN_PART`` of them (less is not held): ``tiny`` (600 JPEGs of ~0.7 KB) or
    ``25 KB`` JPEGs (20)."""
    from helpers import image_bytes
    from tests.support.s3data import noise_jpeg, tar_of

    count = 600 if kind == "tiny" else 20

    def image(i: int) -> bytes:
        return image_bytes(i) if kind == "tiny" else noise_jpeg(i, side=140)

    return {
        f"part-{t}.tar": tar_of(
            [(f"s{t}_{i:03d}", image(t * count + i), i % 3) for i in range(count)]
        )
        for t in range(3)
    }


@pytest.mark.parametrize("kind", ["tiny", "25 KB"])
def test_small_members_of_tars_on_s3_are_fetched_once_on_ray(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Tars of small samples on S3 exported by Ray's tasks: the tasks that scan keep what
    they read in Ray's object store and the shard tasks read it from there, so every
    byte of the tars is fetched by exactly one GET (it was 2x: the scan's, then the
    shards'), the driver holding only refs (the parts lie in the nodes' object stores);
    the export equals the local executor's."""
    from shardex.storage.fetch import held
    from tests.support.s3data import fetched_once_each, same_export, tars_here_and_on_s3

    tars = _tars_to_hold(kind)
    prefix = f"held-{kind.replace(' ', '')}-{cluster}"
    source = tars_here_and_on_s3(tars, tmp_path / "src", s3, prefix)
    # 1,800 tiny samples in shards of 50, not 360 shards of 5: what is fetched is the same
    opts: dict[str, Any] = {"samples_per_shard": 50 if kind == "tiny" else 5, "seed": 3}
    shardex.export(str(tmp_path / "src"), tmp_path / "local", workers=2, **opts)
    parts: list[Any] = []
    real_add = held.HeldTars.add

    def add(self: held.HeldTars, url: str, refs: tuple[Any, ...], spans: Any) -> None:
        parts.extend(refs)
        real_add(self, url, refs, spans)

    monkeypatch.setattr(held.HeldTars, "add", add)
    s3.proxy.reset()
    shardex.export(
        source, tmp_path / "ray", source_storage_options=s3.counted, executor="ray", **opts
    )
    same_export(tmp_path / "local", tmp_path / "ray", source)
    fetched_once_each(s3.proxy.gets(), tars)
    import ray

    where = ray.experimental.get_object_locations(parts)
    assert len(parts) == len(tars)  # one part a tar (each under held.PART_BYTES)
    assert all(where[p]["node_ids"] for p in parts)  # in an object store, not the driver's
    # the images' bytes only (no headers, labels or metadata), and the parts' index
    images = sum(m.size for d in tars.values() for m in _members(d) if m.name.endswith(".jpg"))
    assert images < sum(where[p]["object_size"] for p in parts) < images + 20 << 10


def _wait_until_dead(actor: Any, limit: float = 30.0) -> None:
    """Return once calls to a killed Ray actor fail (Ray kills it in the background)."""
    import ray

    deadline = time.monotonic() + limit
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=limit)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, f"a killed actor still answers after {limit:.0f}s"
        time.sleep(0.02)


def test_tars_not_held_on_ray_are_fetched_again_to_the_same_export(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tars that do not fit in the cluster's object store (one warning line naming the
    first and saying what to do), and parts lost from it before their shards were
    written (freed here; a node lost that Ray cannot make them again on): their members
    are fetched again (2x the bytes), and the export is the same."""
    import warnings

    import ray
    from shardex.errors import RefetchWarning
    from shardex.sources import tars as tars_module
    from shardex.storage.fetch import held
    from tests.support.s3data import upload

    tars = _tars_to_hold("tiny")
    total = sum(len(d) for d in tars.values())
    upload(ObjectStorage(s3.child(f"again-{cluster}"), s3.direct), tars)
    source = s3.child(f"again-{cluster}/")
    opts: dict[str, Any] = {"samples_per_shard": 50, "seed": 3, "executor": "ray"}
    shardex.export(source, tmp_path / "once", source_storage_options=s3.direct, **opts)
    monkeypatch.setattr(tars_module, "HOLD_SHARE", 1e-6)
    s3.proxy.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shardex.export(source, tmp_path / "room", source_storage_options=s3.counted, **opts)
    said = [str(w.message) for w in caught if issubclass(w.category, RefetchWarning)]
    assert len(said) == 1, said
    assert "\n" not in said[0]
    assert said[0].startswith(f"3 of 3 tars ({total:,} bytes, the first '{source}part-0.tar')")
    assert "give the cluster's nodes more object store memory" in said[0]
    assert files_of(tmp_path / "room") == files_of(tmp_path / "once")
    assert sum(r.body_bytes for r in s3.proxy.gets()) > 1.5 * total
    monkeypatch.undo()

    @ray.remote(num_cpus=0)  # type: ignore[misc]
    def small() -> bytes:
        return b"x" * 1000

    class Owner:  # an object whose owner is gone: what a task gets for a lost part. A
        def put(self) -> list[Any]:  # small task result lives only in its owner's memory
            return [small.remote()]

    def lost_object() -> Any:
        """An object whose owner was killed. Ray may still serve it for a while (a CI run
        read it back after the owner was dead), so try a few owners until one is lost."""
        for _ in range(5):
            owner = ray.remote(num_cpus=0)(Owner).remote()  # type: ignore[attr-defined]
            lost = ray.get(owner.put.remote())[0]
            ray.kill(owner)
            _wait_until_dead(owner)  # the kill is asynchronous: till then it serves the object
            try:
                ray.get(lost, timeout=30)
            except ray.exceptions.ObjectLostError:
                return lost
            except ray.exceptions.GetTimeoutError:
                continue
        pytest.fail("no object was lost after its owner was killed, in 5 tries")

    lost = lost_object()
    real_add = held.HeldTars.add

    def add_lost(self: held.HeldTars, url: str, refs: tuple[Any, ...], spans: Any) -> None:
        real_add(self, url, tuple(lost for _ in refs), spans)

    monkeypatch.setattr(held.HeldTars, "add", add_lost)
    s3.proxy.reset()
    shardex.export(source, tmp_path / "lost", source_storage_options=s3.counted, **opts)
    assert files_of(tmp_path / "lost") == files_of(tmp_path / "once")
    assert sum(r.body_bytes for r in s3.proxy.gets()) > 1.5 * total


def test_a_webdataset_export_on_s3_is_re_exported_on_ray_each_byte_fetched_once(
    cluster: int, s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-export on Ray of a webdataset export on S3: its samples are read and checked
    by tasks (the driver reads no byte of a shard), which keep their members in Ray's
    object store for the shard tasks: each shard byte is fetched once (it was twice:
    the driver's check, then the shard tasks'); the output equals the local executor's,
    a damaged sample recorded alike."""
    rels = [f"train/c{i % 3}/big{i:02d}.png" for i in range(24)]
    for i, rel in enumerate(rels):  # noise PNGs: about 100 KB each, 8 a source shard
        write_image(tmp_path / "src" / rel, 100 + i, size=(190, 180))
    url = s3.child(f"wds-{cluster}")
    shardex.export(str(tmp_path / "src"), url, samples_per_shard=8, storage_options=s3.direct)
    source = ObjectStorage(url, s3.direct)
    shard = shardex.read_config(source).splits["train"].shards[1].path
    damaged = bytearray(source.get(shard))
    damaged[len(damaged) // 2] ^= 0xFF  # a sample the check refuses, skipped and recorded
    source.put(shard, bytes(damaged))
    opts: dict[str, Any] = {
        "samples_per_shard": 5,
        "source_storage_options": s3.counted,
        "on_error": "skip",
    }
    shardex.export(url, tmp_path / "local", workers=2, **opts)
    assert shardex.read_config(tmp_path / "local").num_skipped == 1
    read_here: list[str] = []
    real = ObjectStorage.get_range

    def get_range(self: ObjectStorage, path: str, *a: Any) -> Any:
        read_here.append(path)
        return real(self, path, *a)

    monkeypatch.setattr(ObjectStorage, "get_range", get_range)
    s3.proxy.reset()
    shardex.export(url, tmp_path / "ray", executor="ray", **opts)
    assert [p for p in read_here if p.endswith(".tar")] == []  # the tasks read the shards
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")
    config = shardex.read_config(ObjectStorage(url, s3.direct))
    shard_bytes = sum(s.num_bytes for s in config.splits["train"].shards)
    fetched = sum(r.body_bytes for r in s3.proxy.gets() if r.key.endswith(".tar"))
    assert shard_bytes <= fetched < 1.02 * shard_bytes, (fetched, shard_bytes)


# -- where the local branches meet: append, flat, skip, other backends -------------------

SMALL = [
    f"{split}/{cls}/img{i:02d}.jpg" for split in ("train", "val") for cls in "ab" for i in range(5)
]
MORE = [
    f"{split}/{cls}/new{i:02d}.jpg" for split in ("train", "val") for cls in "ab" for i in range(3)
]


def _on_ray_and_locally(
    tmp_path: Path, name: str, workers: int, export: Callable[[Path, dict[str, Any]], object]
) -> Path:
    """``export(out, options)`` run on Ray and by ``workers`` local workers gives the same
    files; returns the Ray run's output."""
    outs = {}
    for kind, options in (("ray", {"executor": "ray"}), ("local", {"workers": workers})):
        out = tmp_path / f"{name}-{kind}"
        export(out, options)
        outs[kind] = files_of(out)
    assert outs["ray"] == outs["local"]
    return tmp_path / f"{name}-ray"


@pytest.mark.parametrize("cluster", [1], ids=["1-node"], indirect=True)
def test_append_flat_and_skip_on_ray_equal_local(cluster: int, tmp_path: Path) -> None:
    make_tree(tmp_path / "src", SMALL)
    make_tree(tmp_path / "more", MORE, first_seed=100)
    (tmp_path / "more" / "train" / "a" / "bad.jpg").write_bytes(b"not an image")

    def appended(out: Path, options: dict[str, Any]) -> None:
        shardex.export(tmp_path / "src", out, samples_per_shard=4, seed=3, **options)
        shardex.export(
            tmp_path / "more",
            out,
            samples_per_shard=4,
            seed=3,
            mode="append",
            on_error="skip",
            **options,
        )

    def flat(out: Path, options: dict[str, Any]) -> None:
        shardex.export(
            tmp_path / "src" / "train", out, samples_per_shard=4, layout="flat", **options
        )

    _on_ray_and_locally(tmp_path, "appended", 2, appended)
    _on_ray_and_locally(tmp_path, "flat", 2, flat)


@pytest.mark.parametrize("cluster", [1], ids=["1-node"], indirect=True)
@pytest.mark.parametrize("backend", ["numpy", "numpy_mmap", "tensor_shards"])
def test_other_backends_on_ray_equal_local(cluster: int, tmp_path: Path, backend: str) -> None:
    make_tree(tmp_path / "src", SMALL)

    def export(out: Path, options: dict[str, Any]) -> None:
        shardex.export(tmp_path / "src", out, backend=backend, samples_per_shard=4, **options)

    on_ray = _on_ray_and_locally(tmp_path, backend, 1, export)
    assert not (on_ray / ".shardex-staging").exists()
