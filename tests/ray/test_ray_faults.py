"""Fault tolerance of exports on a real local Ray cluster (one node, and two), and the
commit's last check.

- A Ray worker SIGKILLed while it runs one of the export's tasks (a shard half-written),
  or a whole node of a 2-node cluster lost: Ray runs the tasks again (its default retries
  on worker death), and the committed export is byte-identical to one nobody interrupted:
  no shard missing, none twice, no leftover.
- The driver (the ``shardex`` command) SIGKILLed mid-export, then ``--mode resume``:
  finished shards are kept untouched (same inode and mtime on disk; no upload of them on
  S3), the rest are written, and the output is byte-identical to the uninterrupted one.
- A shard that vanishes or is cut short after it was written and before the commit:
  nothing is committed, a one-line error names it, and ``--mode resume`` repairs it.

The exports run through the command line (``shardex export-dataset ... --executor ray
--ray-address A``), so these tests hold whichever way the command runs its work on Ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

import shardex
from helpers import files_of, listed_now, make_tree, write_image
from shardex.cli import main
from shardex.errors import NotAnExportError, OutputExistsError, UnverifiedOutputError
from shardex.storage import open_storage
from shardex.storage.local import is_temporary
from tests.support.raycluster import environ, local_ray_cluster
from tests.support.s3data import S3Location

CLI = [sys.executable, "-c", "import sys; from shardex.cli import main; sys.exit(main())"]
PER_SHARD = 6
COUNT = 120  # 20 shards of ~5.5 MB: several rounds of tasks on 2 CPUs
#: Bounds every wait of these tests (they poll, never assume a speed).
LIMIT = 300.0


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image folder (3 classes) read by reference: the tasks read the files themselves.
    PNGs of noise (~0.9 MB): a shard's tar is written in two pieces (the writer flushes
    every 4 MiB), so it lies half-written under a temporary name for a while."""
    root = tmp_path_factory.mktemp("ray-faults-src")
    for i in range(COUNT):
        write_image(root / f"c{i % 3}" / f"img{i:04d}.png", i, size=(640, 480))
    return root


@pytest.fixture(scope="module")
def small_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-faults-small")
    make_tree(root, [f"c{i % 2}/img{i:04d}.jpg" for i in range(40)])
    return root


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray = pytest.importorskip("ray")
    with local_ray_cluster(num_cpus=2):
        yield ray.get_runtime_context().gcs_address


def _args(source: Path, out: str, address: str, *more: str) -> list[str]:
    return [
        "export-dataset",
        str(source),
        "-o",
        out,
        "--samples-per-shard",
        str(PER_SHARD),
        "--executor",
        "ray",
        "--ray-address",
        address,
        "--quiet",
        *more,
    ]


def _env(s3: S3Location | None = None) -> dict[str, str]:
    env = {**os.environ, "SHARDEX_LOCK_LEASE": "2"}  # a killed driver's S3 lock expires fast
    if s3 is not None:
        env["AWS_ACCESS_KEY_ID"] = s3.direct["access_key_id"]
        env["AWS_SECRET_ACCESS_KEY"] = s3.direct["secret_access_key"]
        env["AWS_REGION"] = s3.direct["region"]
    return env


def _s3_flags(s3: S3Location | None) -> list[str]:
    return ["--s3-endpoint-url", s3.counted["endpoint_url"]] if s3 is not None else []


def _run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=LIMIT, check=False
    )
    assert done.returncode == 0, f"shardex {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def _objects(location: str, s3: S3Location | None) -> dict[str, bytes]:
    if s3 is None:
        return files_of(Path(location))
    storage = open_storage(location, s3.direct)
    return {name: storage.get(name) for name in storage.list()}


@pytest.fixture(scope="module")
def uninterrupted(
    source: Path, ray_address: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ray-uninterrupted") / "out"
    _run(_args(source, str(out), ray_address), _env())
    assert shardex.verify(out).ok
    return files_of(out)


def _task_workers() -> list[psutil.Process]:
    """This cluster's Ray workers running one of the export's tasks now (Ray titles a
    worker ``ray::<function>`` while it runs a task, ``ray::IDLE`` between tasks). Only
    processes this test process started: other clusters on the machine are left alone."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            title = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        name = title.split()[0] if title else ""
        # not an idle worker, nor one of Ray's own agents (ray::DashboardAgent ...)
        if name.startswith("ray::") and name != "ray::IDLE" and not name.endswith("Agent"):
            found.append(proc)
    return found


def _wait_for(what: str, ready: Callable[[], Any], child: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + LIMIT
    while not (got := ready()):
        assert child.poll() is None, f"the export ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {LIMIT:.0f}s"
        time.sleep(0.005)
    return got


def test_a_ray_worker_killed_mid_task_is_retried_to_the_same_bytes(
    source: Path, ray_address: str, uninterrupted: dict[str, bytes], tmp_path: Path
) -> None:
    # A shard takes milliseconds to write: the kill may land just after a rename. Every
    # run must end with the uninterrupted bytes; at least one kill must land mid-write
    # (a half shard left that nobody renamed) for the retry of a torn write to be shown.
    landed = 0
    for attempt in range(5):
        out = tmp_path / f"out{attempt}"
        landed += bool(_kill_a_writing_worker(source, out, ray_address))
        # Ray's retry wrote the shard again: every shard once, no hole, no leftover
        assert files_of(out) == uninterrupted
        assert shardex.verify(out).ok
        if landed:
            break
    assert landed, "no kill landed while a shard was half-written in 5 runs"


def _kill_a_writing_worker(source: Path, out: Path, ray_address: str) -> list[Path]:
    """Run the export, SIGKILL every task worker once a shard is half-written (a few
    finished), let it finish; the half-written files seen right after the kill."""
    child = subprocess.Popen([*CLI, *_args(source, str(out), ray_address)], env=_env())
    try:

        def writing() -> list[Path]:
            if len(listed_now(out, "*/*.parquet")) < 2:
                return []
            return [p for p in listed_now(out, "*/.*") if is_temporary(p.name)] and _task_workers()

        workers = _wait_for("a shard being written", writing, child)
        for worker in workers:  # every task running now, the one writing that shard too
            worker.send_signal(signal.SIGKILL)
        for worker in workers:
            worker.wait(timeout=30)
        killed_mid_write = [p for p in listed_now(out, "*/.*") if is_temporary(p.name)]
        assert child.wait(timeout=LIMIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return killed_mid_write


def test_a_ray_worker_killed_while_it_scans_a_tar_is_retried_to_the_same_bytes(
    ray_address: str, s3: S3Location, tmp_path: Path
) -> None:
    """Tars on S3 whose scan tasks keep what they read for the shard tasks (a streaming
    generator task each, see ``shardex.storage.fetch.held``): every worker scanning a tar
    SIGKILLed mid-scan; Ray runs the scans again and the export is byte-identical to one
    nobody interrupted."""
    from helpers import image_bytes
    from tests.support.s3data import tar_of, upload

    tars = {  # ~8 MB each: a scan of a few hundred ms, to land in
        f"part-{t}.tar": tar_of([(f"s{t}_{i:04d}", image_bytes(i), i % 3) for i in range(2500)])
        for t in range(3)
    }
    upload(open_storage(s3.child("scanned"), s3.direct), tars)  # type: ignore[arg-type]
    # shards of 500: the scans are what this test kills, not the ~1,250 shards of 6
    flags = ["--source-s3-endpoint-url", s3.direct["endpoint_url"], "--samples-per-shard", "500"]
    src = s3.child("scanned/")
    _run([*_args(src, str(tmp_path / "whole"), ray_address), *flags], _env(s3))  # type: ignore[arg-type]
    out = tmp_path / "killed"
    args = [*_args(src, str(out), ray_address), *flags]  # type: ignore[arg-type]
    child = subprocess.Popen([*CLI, *args], env=_env(s3))
    try:

        def scanning() -> list[psutil.Process]:
            return [w for w in _task_workers() if "_call_kept" in " ".join(w.cmdline())]

        workers = _wait_for("a tar being scanned", scanning, child)
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        assert child.wait(timeout=LIMIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert files_of(out) == files_of(tmp_path / "whole")
    assert shardex.verify(out).ok


@pytest.fixture
def two_nodes() -> Iterator[Any]:
    """A real 2-node Ray cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``: two raylets,
    one CPU each); yields the cluster, its second node at ``cluster.second``."""
    pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    saved = ray_constants.ENABLE_RAY_CLUSTER
    # loopback only (see local_ray_cluster), here and in the drivers the tests start: else
    # Ray's client turns 127.0.0.1 into the machine's address, where nothing listens
    ray_constants.ENABLE_RAY_CLUSTER = False
    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 100 << 20}
    with environ(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"):
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        try:
            cluster.second = cluster.add_node(**node)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            cluster.shutdown()
            ray_constants.ENABLE_RAY_CLUSTER = saved


def _lose_the_second_node_mid_export(
    two_nodes: Any, args: list[str], env: dict[str, str], out: Path
) -> None:
    """Run ``shardex ARGS``; SIGKILL the cluster's second node once a few shards are out
    and one of its workers runs a task; the export must still succeed."""
    raylet = psutil.Process(two_nodes.second.all_processes["raylet"][0].process.pid)
    child = subprocess.Popen([*CLI, *args], env=env)

    def second_node_writing() -> list[psutil.Process]:
        if len(listed_now(out, "*/*.parquet")) < 2:
            return []
        ours = {p.pid for p in raylet.children(recursive=True)}
        return [w for w in _task_workers() if w.pid in ours]

    try:
        _wait_for("a task on the second node", second_node_writing, child)
        two_nodes.remove_node(two_nodes.second, allow_graceful=False)  # SIGKILLs the node
        assert child.wait(timeout=LIMIT) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not raylet.is_running()


def test_a_ray_node_lost_mid_export_is_retried_on_the_other_to_the_same_bytes(
    source: Path, uninterrupted: dict[str, bytes], two_nodes: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _lose_the_second_node_mid_export(
        two_nodes, _args(source, str(out), two_nodes.address), _env(), out
    )
    assert files_of(out) == uninterrupted
    assert shardex.verify(out).ok


def test_a_ray_node_lost_holding_scanned_tar_parts_is_retried_to_the_same_bytes(
    two_nodes: Any, s3: S3Location, tmp_path: Path
) -> None:
    """Tars on S3 whose scan tasks keep what they read in Ray's object store for the
    shard tasks (``shardex.storage.fetch.held``): the second node, where scans ran and their
    parts lie, SIGKILLed while it writes shards. The parts it held are made again by Ray
    or, failing that, their members fetched from the store: the export is byte-identical
    to one nobody interrupted."""
    from helpers import image_bytes
    from tests.support.s3data import tar_of, upload

    tars = {
        f"part-{t}.tar": tar_of([(f"s{t}_{i:04d}", image_bytes(i), i % 3) for i in range(300)])
        for t in range(4)
    }
    upload(open_storage(s3.child("held"), s3.direct), tars)  # type: ignore[arg-type]
    more = ["--source-s3-endpoint-url", s3.direct["endpoint_url"], "--samples-per-shard", "50"]
    src = s3.child("held/")
    _run(_args(src, str(tmp_path / "whole"), two_nodes.address, *more), _env(s3))  # type: ignore[arg-type]
    out = tmp_path / "killed"
    args = _args(src, str(out), two_nodes.address, *more)  # type: ignore[arg-type]
    _lose_the_second_node_mid_export(two_nodes, args, _env(s3), out)
    assert files_of(out) == files_of(tmp_path / "whole")
    assert shardex.verify(out).ok


def _finished_shards(location: str, s3: S3Location | None) -> set[str]:
    """Shards whose tar and sidecar are both out (the sidecar is written last)."""
    names = (
        [p.relative_to(location).as_posix() for p in listed_now(Path(location), "**/*")]
        if s3 is None
        else list(open_storage(location, s3.direct).list())
    )
    tars = {n.removesuffix(".tar") for n in names if n.endswith(".tar")}
    return {stem for stem in tars if f"{stem}.parquet" in names}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_killed_ray_driver_resumes_keeping_its_finished_shards(
    source: Path,
    ray_address: str,
    uninterrupted: dict[str, bytes],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    s3: S3Location | None = request.getfixturevalue("s3") if where == "s3" else None
    out = s3.child("out") if s3 is not None else str(tmp_path / "out")
    args = [*_args(source, out, ray_address), *_s3_flags(s3)]
    child = subprocess.Popen([*CLI, *args], env=_env(s3))
    try:
        _wait_for("4 finished shards", lambda: len(_finished_shards(out, s3)) >= 4, child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with pytest.raises(NotAnExportError):
        shardex.read_config(out, storage_options=s3.direct if s3 else None)
    finished = _finished_shards(out, s3)
    assert 4 <= len(finished) < COUNT // PER_SHARD
    # the killed run's tasks had staged their shards' index parts in the output
    staged = [n for n in _objects(out, s3) if n.startswith(".shardex-staging/")]
    assert staged, "the killed run staged no part: the test saw no staging"
    stamps = {}
    if s3 is None:
        for stem in finished:
            for ext in (".tar", ".parquet"):
                st = os.stat(Path(out) / f"{stem}{ext}")
                stamps[stem + ext] = (st.st_ino, st.st_mtime_ns)
    else:
        s3.proxy.reset()
        # the killed driver's lease (SHARDEX_LOCK_LEASE=2) may still run for 2 s: a resume
        # started sooner is refused (OutputLockedError), as it must be
        time.sleep(2.5)

    _run([*args, "--mode", "resume"], _env(s3))

    # the same bytes, file for file: the killed run's staged parts gone too
    assert _objects(out, s3) == uninterrupted
    if s3 is None:
        for name, (ino, mtime) in stamps.items():
            st = os.stat(Path(out) / name)
            assert (st.st_ino, st.st_mtime_ns) == (ino, mtime), f"{name} was written again"
    else:
        kept = {f"{stem}{ext}" for stem in finished for ext in (".tar", ".parquet")}
        written = {
            r.key.partition("/out/")[2]
            for r in s3.proxy.requests
            if r.method in ("PUT", "POST") and "/out/" in r.key
        }
        assert written, "the resumed run uploaded nothing: the test saw no upload"
        assert not written & kept, f"finished shards uploaded again: {sorted(written & kept)}"
    assert shardex.verify(out, storage_options=s3.direct if s3 else None).ok


# -- the commit's last check -------------------------------------------------------------


def _damage(how: str) -> Callable[[Any, Any], None]:
    """What happens to the export's second shard between its write and the commit."""

    def damage(storage: Any, config: Any) -> None:
        shard = next(iter(config.splits.values())).shards[1]
        if how == "vanished":
            storage.delete(shard.path)
        else:  # cut short: the same name, fewer bytes
            storage.put(shard.path, storage.get(shard.path)[:-512])

    return damage


def _commit_after(damage: Callable[[Any, Any], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """A test hook at the one moment that matters: every shard written, commit next."""
    import shardex.engine.transaction as transaction

    real = transaction.commit

    def commit(storage: Any, config: Any) -> None:
        damage(storage, config)
        real(storage, config)

    monkeypatch.setattr(transaction, "commit", commit)


@pytest.mark.parametrize(
    ("how", "where"),
    [("vanished", "local"), ("cut", "local"), ("cut", "s3"), ("vanished", "ray")],
)
def test_a_shard_lost_before_the_commit_stops_it_with_one_line(
    small_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    how: str,
    where: str,
) -> None:
    s3: S3Location | None = request.getfixturevalue("s3") if where == "s3" else None
    out = s3.child("out") if s3 is not None else str(tmp_path / "out")

    def ray() -> list[str]:
        return ["--executor", "ray", "--ray-address", request.getfixturevalue("ray_address")]

    args = [
        "export-dataset",
        str(small_source),
        "-o",
        out,
        "--samples-per-shard",
        "8",
        "--quiet",
        *_s3_flags(s3),
        *(ray() if where == "ray" else []),
    ]
    env = {k: v for k, v in _env(s3).items() if k.startswith("AWS_")}
    with monkeypatch.context() as patched:
        _commit_after(_damage(how), patched)
        result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert ".tar'" in lines[0]
    assert ("is missing" if how == "vanished" else "bytes, its writer reported") in lines[0]
    assert "nothing was committed" in lines[0]
    options = s3.direct if s3 is not None else None
    with pytest.raises(NotAnExportError):
        shardex.read_config(out, storage_options=options)
    # running it again repairs the shard and commits
    again = CliRunner().invoke(main, [*args, "--mode", "resume"], env=env)
    assert again.exit_code == 0, again.output
    assert shardex.verify(out, storage_options=options).ok


def test_python_users_are_told_the_python_way_to_resume(
    small_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusals that say how to resume or replace name the keyword a Python caller
    passes, beside the command-line flag."""
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        _commit_after(_damage("vanished"), patched)
        with pytest.raises(UnverifiedOutputError) as lost:
            shardex.export(small_source, out, samples_per_shard=8, workers=1)
    assert "mode='resume' in Python" in str(lost.value), lost.value
    assert "--mode resume" in str(lost.value)
    with pytest.raises(OutputExistsError) as unfinished:  # the files of an unfinished export
        shardex.export(small_source, out, samples_per_shard=8, workers=1)
    assert "mode='resume' in Python" in str(unfinished.value), unfinished.value
    assert "overwrite=True in Python" in str(unfinished.value)
    config = shardex.export(small_source, out, samples_per_shard=8, workers=1, mode="resume")
    assert config.num_samples == 40


def test_the_commit_removes_only_its_own_exports_temporary_files(
    small_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed attempt's temporary shard goes at the commit; a write in progress of
    another export, made into a folder inside this output, is left to finish."""
    from shardex.storage.local import LocalObjectWriter

    out = tmp_path / "out"
    writers: list[LocalObjectWriter] = []
    names: list[str] = []

    def meanwhile(storage: Any, config: Any) -> None:
        del storage
        shard = next(iter(config.splits.values())).shards[0].path
        killed = LocalObjectWriter(out, shard)  # an attempt that died mid-write
        killed.write(b"half a shard")
        killed._file.close()  # (its process is gone: never renamed, never removed)
        names.append(Path(shard).name)
        nested = LocalObjectWriter(out, f"nested/train/{names[0]}")
        nested.write(b"another export's shard, still being written")
        writers.append(nested)

    with monkeypatch.context() as patched:
        _commit_after(meanwhile, patched)
        shardex.export(small_source, out, samples_per_shard=8, workers=1)
    assert not [p for p in out.rglob(".*.tmp-*") if "nested" not in p.parts]
    writers[0].commit()  # the nested export's write completes
    nested = out / "nested" / "train" / names[0]
    assert nested.read_bytes() == b"another export's shard, still being written"
    assert [p.name for p in nested.parent.iterdir()] == [names[0]]
