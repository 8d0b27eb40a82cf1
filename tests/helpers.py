"""Small helpers shared by the tests of every folder: tiny images, folders and tars, small
exports and checks of them, the CLI's error line and the skip records, processes, ports and
open files."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardex.refs.scan import MEMBERS, SampleStream, ScanBatch
from shardex.sources.base import Source
from shardex.storage.fetch.bytes import MemberReader

_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


#: The marks that ignore the deprecation warnings Ray 2.60's DataContext() gives about three
#: of its own fields while it is built (a Ray Data test module's ``pytestmark``).
RAY_DATA_WARNINGS: Final = [
    pytest.mark.filterwarnings(f"ignore:`{name}` is deprecated:DeprecationWarning:ray.data.context")
    for name in ("use_push_based_shuffle", "use_polars", "use_arrow_tensor_v2")
]


def image_bytes(seed: int, fmt: str = "jpg", size: tuple[int, int] = (12, 10)) -> bytes:
    """A small encoded image whose pixels depend on ``seed`` (distinct bytes per seed)."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=_FORMATS[fmt.lower()])
    return out.getvalue()


def write_image(path: Path, seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    """Write an image in the format its suffix names; returns its bytes."""
    data = image_bytes(seed, path.suffix.lstrip("."), size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def make_tree(root: Path, rel_paths: list[str], *, first_seed: int = 0) -> dict[str, bytes]:
    """Write one image per relative path under root; returns ``{rel_path: bytes}``."""
    return {rel: write_image(root / rel, first_seed + i) for i, rel in enumerate(sorted(rel_paths))}


def _add_members(tf: tarfile.TarFile, members: Iterable[tuple[str, bytes]]) -> None:
    for name, data in members:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))


def tar_bytes(members: Iterable[tuple[str, bytes]], fmt: int = tarfile.DEFAULT_FORMAT) -> bytes:
    """A tar of ``members`` (name and bytes each), in their order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        _add_members(tf, members)
    return out.getvalue()


def write_tar(
    path: Path, members: Iterable[tuple[str, bytes]], fmt: int = tarfile.DEFAULT_FORMAT
) -> Path:
    """The tar of ``members`` (name and bytes each) written at ``path``, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tf:
        _add_members(tf, members)
    return path


def labelled_tar(path: Path, count: int, image: bytes) -> Path:
    """A tar of ``count`` samples ``s{i:06d}``, each ``image`` as its .jpg and ``i % 5`` as
    its .cls label, written at ``path``."""
    return write_tar(
        path,
        (
            (f"s{i:06d}.{ext}", data)
            for i in range(count)
            for ext, data in (("jpg", image), ("cls", str(i % 5).encode()))
        ),
    )


def folder_with_bad_images(root: Path, count: int, bad: set[int]) -> None:
    """``count`` JPEGs at ``root/c{i % 2}/{i:04d}.jpg``; those numbered in ``bad`` cut in
    half (found bad only when read whole)."""
    from shardex.testing import make_image

    for i in range(count):
        path = root / f"c{i % 2}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = make_image(i)
        path.write_bytes(data[: len(data) // 2] if i in bad else data)


def image_keys(numbers: set[int]) -> list[str]:
    """The keys of :func:`folder_with_bad_images`' images numbered ``numbers``, sorted."""
    return sorted(f"c{i % 2}/{i:04d}" for i in numbers)


def assert_skipped_as_if_absent(src: Path, bad: set[int], out: Path, **options: Any) -> None:
    """The export at ``out`` of :func:`folder_with_bad_images` ``src`` under
    ``on_error="skip"`` has the shards (names aside) of an export with ``options`` of
    ``src`` without the cut images (they are deleted), and its errors.parquet names them."""
    import shardex

    for i in bad:
        (src / f"c{i % 2}" / f"{i:04d}.jpg").unlink()
    clean = shardex.export(src, out.with_name(f"{out.name}-clean"), **options)
    shards = shardex.read_config(out).splits["train"].shards
    assert [(s.num_samples, s.num_bytes, s.checksum) for s in shards] == [
        (s.num_samples, s.num_bytes, s.checksum) for s in clean.splits["train"].shards
    ]
    assert sorted(row["key"] for row in skipped_rows(out)) == image_keys(bad)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every regular file under folder, by posix relative path, with its bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def error_line(stderr: str) -> str:
    """The one ``error: ...`` line a failed command must print, and nothing else."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {stderr!r}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def skipped_rows(out: Path) -> list[dict[str, str]]:
    """The rows of an export's errors.parquet: what ``on_error="skip"`` left out, and why."""
    return pq.read_table(out / "errors.parquet").to_pylist()


def assert_no_export(out: Path) -> None:
    """Nothing at ``out`` reads as an export: no config.yaml, and opening it fails."""
    import shardex
    from shardex.errors import NotAnExportError

    assert not (out / "config.yaml").exists()
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(out)


def open_files_under(folder: Path) -> list[str]:
    """What this process holds open under ``folder`` (from /proc/self/fd; a deleted file
    is named with `` (deleted)`` after it)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def assert_same_but_the_source(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    """Two exports' files (as :func:`files_of` gives them) are the same byte for byte, and
    their config.yaml the same but for the sources it names (their URI and kind)."""
    import yaml

    assert sorted(a) == sorted(b)
    for name in a:
        if name != "config.yaml":
            assert a[name] == b[name], name
    config_a, config_b = (yaml.safe_load(f["config.yaml"]) for f in (a, b))
    for config in (config_a, config_b):
        for source in config["source_datasets"]:
            del source["uri"], source["kind"]
    assert config_a == config_b


def files_but_the_lock(folder: Path) -> dict[str, bytes]:
    """:func:`files_of` an export, less its lock file (``.shardex-lock``)."""
    return {name: data for name, data in files_of(folder).items() if name != ".shardex-lock"}


def image_field(sample: dict[str, object]) -> bytes:
    """The one image member of a raw sample (whatever its extension)."""
    found = [
        v
        for k, v in sample.items()
        if k.rpartition(".")[2] in {"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"}
    ]
    assert len(found) == 1, f"expected one image field, sample has {sorted(sample)}"
    data = found[0]
    assert isinstance(data, bytes)
    return data


def labelled_images(count: int, first: int = 0) -> dict[str, list[Any]]:
    """An in-memory source: ``count`` JPEGs (``make_image`` of ``first`` on) labelled
    ``i % 3``, keyed by their number in six digits."""
    from shardex.testing import make_image

    numbers = range(first, first + count)
    return {
        "jpg": [make_image(i) for i in numbers],
        "label": [i % 3 for i in numbers],
        "key": [f"{i:06d}" for i in numbers],
    }


def small_export(root: Path, count: int, samples_per_shard: int) -> Path:
    """``count`` samples of ``make_sample_folder`` exported to ``root / "out"``."""
    import shardex
    from shardex.testing.data import make_sample_folder

    folder = make_sample_folder(root / "src", count)
    shardex.export(str(folder.table), root / "out", samples_per_shard=samples_per_shard, workers=1)
    return root / "out"


def copy_of(export: Path, tmp_path: Path) -> Path:
    """A copy of ``export`` at ``tmp_path / "out"``, for a test to damage."""
    copy = tmp_path / "out"
    shutil.copytree(export, copy)
    return copy


def listed_now(root: Path, pattern: str) -> list[Path]:
    """``root.glob(pattern)`` while an export writes under ``root``: a folder that goes
    away while it is listed (the staging folder, a temporary one) is listed again."""
    while True:
        try:
            return list(root.glob(pattern))
        except FileNotFoundError:
            continue


def kill_once_shards_appear(code: str, args: list[str], out: Path, limit: float = 120) -> None:
    """Run ``python -c code *args`` (an export into ``out``), SIGKILL it as soon as ``out``
    holds a shard, and check the kill landed before its commit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env)
    deadline = time.monotonic() + limit
    while not listed_now(out, "*/images-*.tar") and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(out.glob("*/images-*.tar")), "the export never reached its shards"
    assert not (out / "config.yaml").exists(), "killed after its commit: nothing to test"


def shm_entries() -> set[str]:
    """The names in /dev/shm now."""
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def shm_left_behind(before: set[str]) -> set[str]:
    """Entries of /dev/shm made since ``before`` that no live process maps: left behind.

    /dev/shm is shared by the whole machine, so entries other programs are using at the
    time (mapped by their processes) do not count.
    """
    deadline = time.monotonic() + 5
    while True:
        new = shm_entries() - before
        in_use: set[str] = set()
        for maps in Path("/proc").glob("[0-9]*/maps"):
            try:
                in_use.update(re.findall(r"/dev/shm/(\S+)", maps.read_text()))
            except OSError:  # gone, or another user's
                continue
        if not new - in_use or time.monotonic() > deadline:
            return new - in_use
        time.sleep(0.1)


def peak_rss_kb(code: str, args: list[str]) -> int:
    """Peak resident memory (VmHWM, KiB) of a fresh process running ``python -c code
    *args`` (not ru_maxrss: a child started by fork and exec keeps its parent's peak)."""
    report = (
        "\nprint([ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", code + report, *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout.split()[-1])


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(server: socketserver.BaseServer) -> Iterator[str]:
    """Serve on a thread until the generator closes (a fixture's ``yield from``); yields
    the server's loopback ``http://`` URL."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Inlined(Source):
    """``source`` with each member's bytes read into its batch, as an in-memory source
    holds them: an export of it must write the same files as one of ``source``."""

    kind = "inlined"

    def __init__(self, source: Source) -> None:
        self.uri, self._source = source.uri, source
        self.kind = source.kind  # type: ignore[misc]  # config.yaml records the source's

    def stream(self) -> SampleStream:
        stream = self._source.stream()
        return SampleStream(map(_inlined, stream.batches), stream.label_names)


def _inlined(batch: ScanBatch) -> ScanBatch:
    table = batch.table
    reader = MemberReader()
    rows = table.column(MEMBERS).to_pylist()
    for row in rows:
        for m in row or ():
            if m["data"] is None:
                m["data"] = bytes(reader.read(m))
                m["path"], m["offset"], m["size"] = None, -1, len(m["data"])
    reader.close()
    column = pa.array(rows, table.schema.field(MEMBERS).type)
    return ScanBatch(
        table.set_column(table.column_names.index(MEMBERS), MEMBERS, column), batch.left_out
    )
