from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np
import pytest

import shardex
from shardex.backends.registry import get_backend
from shardex.errors import ConfigError, FormatError
from shardex.fields import npy_bytes
from shardex.refs.scan import ScanResult, build_table
from shardex.sources.base import Source
from shardex.storage.local import LocalStorage
from shardex.testing import BackendTests, make_sample_folder
from shardex.testing.backend import image_of

tensordict = pytest.importorskip("tensordict")
torch = pytest.importorskip("torch")

from shardex.backends.tensordict_memmap import (  # noqa: E402  (needs tensordict)
    TensorDictBackend,
    column_name,
    tensordict_key,
)


class TestTensorDict(BackendTests):
    backend_name = "tensordict_memmap"


def _folder(out: Path, split: str = "train") -> Path:
    (shard,) = shardex.read_config(out).split(split).shards
    return out / shard.path


def _load(out: Path, split: str = "train") -> Any:
    """The split as plain tensordict reads it, without shardex."""
    return tensordict.TensorDict.load_memmap(_folder(out, split))


def _ragged(td: Any, name: str, i: int) -> np.ndarray:
    offsets = td[name, "offsets"]
    return td[name, "data"][int(offsets[i]) : int(offsets[i + 1])].numpy()


def test_plain_tensordict_reads_what_shardex_reads(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "src", n=12)
    out = tmp_path / "out"
    shardex.export(folder.table, out, backend="tensordict_memmap", workers=1)
    td = _load(out)
    assert td.batch_size == torch.Size([])
    ds = shardex.open_dataset(out, split="train")
    assert td["label__label"].tolist() == [int(s["cls"]) for s in ds]
    for i, sample in enumerate(ds):
        assert bytes(_ragged(td, "__key__", i)) == sample["__key__"].encode()
        assert bytes(_ragged(td, "json", i)) == sample["json"]
        image = image_of(sample)
        ext = next(k for k in sample if sample[k] is image)
        assert bool(td[ext, "present"][i])
        assert bytes(_ragged(td, ext, i)) == image == folder.images[sample["__key__"]]


_DTYPES: Final = (
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


def _dtype_data(n: int = 6) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    data: dict[str, Any] = {}
    for name in _DTYPES:
        info = np.iinfo(name) if np.dtype(name).kind in "iu" else None
        values = (
            rng.integers(0, 2, (n, 3))
            if info is None
            else rng.integers(info.min, info.max, (n, 3), dtype=name, endpoint=True)
        )
        data[f"a_{name}"] = values.astype(name)
    data["scalar"] = np.arange(n, dtype=np.uint32) * 4_000_000  # 0-d per sample: column (N,)
    data["big_endian"] = np.arange(n * 2, dtype=">i4").reshape(n, 2)
    data["ragged_big_endian"] = [np.arange(i + 1, dtype=">i2") * 300 for i in range(n)]
    data["ragged_u64"] = [np.full(i, 2**64 - 1 - i, dtype=np.uint64) for i in range(n)]
    return data


def test_every_torch_dtype_round_trips(tmp_path: Path) -> None:
    data = _dtype_data()
    out = tmp_path / "out"
    shardex.export(data, out, backend="tensordict_memmap", workers=1)
    ds = shardex.open_dataset(out, split="train", decode=True)
    td = _load(out)
    for i, sample in enumerate(ds):
        for name, values in data.items():
            want = np.asarray(values[i])
            got = sample[f"{name}.npy"]
            assert got.dtype == want.dtype.newbyteorder("="), name
            assert got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)
    for name in _DTYPES:
        assert td[f"a_{name}"].numpy().dtype == np.dtype(name)  # no cast in the file either
    np.testing.assert_array_equal(td["scalar"].numpy(), data["scalar"])
    assert td["big_endian"].dtype == torch.int32
    np.testing.assert_array_equal(td["big_endian"].numpy(), data["big_endian"])
    assert td["ragged_u64", "shapes"].tolist() == [[i] for i in range(len(ds))]
    assert td["ragged_big_endian", "data"].dtype == torch.int16


@pytest.mark.parametrize(
    "values",
    [
        np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[s]"),
        np.array([["ab"], ["cd"]]),  # unicode strings
    ],
    ids=["datetime", "str"],
)
def test_dtype_torch_cannot_hold_is_refused_before_writing(
    tmp_path: Path, values: np.ndarray
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="booleans or numbers"):
        shardex.export({"x": values}, out, backend="tensordict_memmap", workers=1)
    assert not (out / "config.yaml").exists()
    assert not list(out.rglob("*.memmap"))


class _Rows(Source):
    """Samples whose fields are given member by member (some samples lack some fields)."""

    kind: ClassVar[str] = "rows"

    def __init__(self, rows: list[dict[str, bytes]]) -> None:
        self.rows, self.uri = rows, "rows"

    def scan(self) -> ScanResult:
        members = [
            [
                {"ext": e, "path": None, "offset": -1, "size": len(d), "data": d}
                for e, d in r.items()
            ]
            for r in self.rows
        ]
        keys = [f"{i:03d}" for i in range(len(self.rows))]
        return ScanResult(build_table(keys, keys, members))


def test_optional_fixed_field_and_reserved_names(tmp_path: Path) -> None:
    rows = [{"shape.npy": npy_bytes(np.array([i, i + 1]))} for i in range(5)]
    for i in (1, 3):
        rows[i]["opt.npy"] = npy_bytes(np.array(i, dtype=np.float32))
    out = tmp_path / "out"
    shardex.export(_Rows(rows), out, backend="tensordict_memmap", workers=1)
    td = _load(out)
    # "shape" is an entry of tensordict's own meta.json: stored as "shape_"
    assert td["shape_"].tolist() == [[i, i + 1] for i in range(5)]
    assert td["opt", "present"].tolist() == [bool(i % 2) for i in range(5)]
    assert td["opt", "values"][3].item() == 3.0
    ds = shardex.open_dataset(out, split="train", decode=True)
    for i, sample in enumerate(ds):
        assert sample["shape.npy"].tolist() == [i, i + 1]
        assert ("opt.npy" in sample) == bool(i % 2)


@pytest.mark.parametrize(
    "column",
    [
        "jpg.data",
        "__key__.offsets",
        "x",
        "x.present",
        "shape",
        "shape_",
        "device__.shapes",
        "_type",
    ],
)
def test_key_mapping_is_reversible(column: str) -> None:
    grouped = frozenset({"x", "shape_"})
    key = tensordict_key(column, grouped)
    assert column_name(key) == column
    assert key[0] not in ("shape", "device", "_type")


def test_samples_are_read_only_views_and_survive_fork(tmp_path: Path) -> None:
    out = tmp_path / "out"
    data = {"v": [np.arange(i + 1, dtype=np.int16) for i in range(4)]}
    shardex.export(data, out, backend="tensordict_memmap", workers=1)
    ds = shardex.open_dataset(out, split="train", decode=True)
    value = ds[3]["v.npy"]
    with pytest.raises(ValueError, match="read-only"):
        value[0] = 7  # would write into the export's file through the shared mapping
    # a DataLoader worker forks after the parent has mapped the files: the child reopens
    assert _in_forked_child(ds, 2) == data["v"][2].tolist()
    assert ds[1]["v.npy"].tolist() == [0, 1]  # and the parent still reads after the fork


def _in_forked_child(ds: Any, i: int) -> list[int] | str:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not the test runner's handler
        signal.alarm(20)  # a hang becomes an answer
        try:
            os.write(write, json.dumps(ds[i]["v.npy"].tolist()).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    answer = os.read(read, 4096).decode()
    os.close(read)
    return json.loads(answer) if answer else "no answer"


def test_damaged_file_is_refused_not_zero_filled(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardex.export(
        {"v": np.arange(40, dtype=np.int64).reshape(10, 4)}, out, backend="tensordict_memmap"
    )
    leaf = _folder(out) / "v.memmap"
    os.truncate(leaf, 16)
    with pytest.raises(FormatError, match="damaged"):
        shardex.open_dataset(out, split="train", decode=True)[5]
    assert leaf.stat().st_size == 16  # tensordict would have grown it with zeros


def test_storage_without_local_files_is_staged_and_cached(tmp_path: Path, cache_dir: Path) -> None:
    """A storage that offers no local path (object storage) gets the same files, uploaded
    from a staging folder, and is read from one checked copy in the cache."""

    class Remote(LocalStorage):
        def local_path(self, path: str) -> None:  # type: ignore[override]
            return None

    backend = get_backend("tensordict_memmap")
    assert backend.capabilities.remote is True
    data = _dtype_data()
    local = shardex.export(data, tmp_path / "local", backend="tensordict_memmap", workers=1)
    remote = shardex.export(
        data, Remote(str(tmp_path / "remote")), backend="tensordict_memmap", workers=1
    )
    assert remote.splits == local.splits  # same files, sizes and checksums
    for path in local.split("train").files:
        assert (tmp_path / "remote" / path).read_bytes() == (tmp_path / "local" / path).read_bytes()
    before = (
        set((cache_dir / "tensordict").glob("*")) if (cache_dir / "tensordict").exists() else set()
    )
    ds = shardex.open_dataset(Remote(str(tmp_path / "remote")))
    assert list(ds) == list(shardex.open_dataset(tmp_path / "local"))
    (copy,) = set((cache_dir / "tensordict").glob("*")) - before
    assert tensordict.TensorDict.load_memmap(copy).keys() == _load(tmp_path / "local").keys()


def test_same_export_twice_gives_identical_files(tmp_path: Path) -> None:
    data = _dtype_data()
    a = shardex.export(data, tmp_path / "a", backend="tensordict_memmap", workers=1)
    b = shardex.export(data, tmp_path / "b", backend="tensordict_memmap", workers=1)
    assert a.splits == b.splits
    c = shardex.export(data, tmp_path / "a", backend="tensordict_memmap", overwrite=True)

    def content(config: shardex.ExportConfig) -> list[tuple[int, int, str]]:
        shards = [s for info in config.splits.values() for s in info.shards]
        return [(s.num_samples, s.num_bytes, s.checksum) for s in shards]

    # replacing a committed export writes under fresh names (never over files it names)
    assert content(c) == content(a)
    assert c.splits["train"].shards[0].path != a.splits["train"].shards[0].path
    assert not list((tmp_path / "a" / "train").glob("*.tmp-*"))


def test_pickled_entries_are_never_loaded(tmp_path: Path) -> None:
    from shardex.backends.tensordict_memmap import _load_memmap

    td = tensordict.TensorDict({"v": torch.arange(3)}, batch_size=[])
    td["obj"] = tensordict.NonTensorData({1, 2})  # tensordict pickles what JSON cannot hold
    td.memmap(tmp_path / "td")
    with pytest.raises(FormatError, match="pickled"):
        _load_memmap(tmp_path / "td")


def test_write_run_records_every_file_and_native_byte_order(tmp_path: Path) -> None:
    columns = {
        "x": np.arange(3, dtype=">i4"),  # a caller's big-endian array: same values, native order
        "y.data": np.arange(5, dtype=np.float16),
        "y.offsets": np.array([0, 2, 5]),
        "y.present": np.array([True, True]),
        "z.data": np.empty(0, np.uint8),  # tensordict writes no file for an empty tensor
        "z.offsets": np.zeros(3, np.int64),
    }
    written = TensorDictBackend().write_run(LocalStorage(tmp_path), "s/tensordict-0a", columns, ())
    on_disk = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert list(written.files) == on_disk
    assert written.num_bytes == sum((tmp_path / f).stat().st_size for f in on_disk)
    assert written.checksum.startswith("xxh3_64:")
    td = tensordict.TensorDict.load_memmap(tmp_path / "s/tensordict-0a")
    assert td["x"].tolist() == [0, 1, 2]
    assert td["y", "data"].dtype == torch.float16
    assert td["z", "data"].shape == (0,)


_KILLED_EXPORT = """
import json, sys
import numpy as np
import shardex
out, options = sys.argv[1], json.loads(sys.argv[2])
data = {
    "key": [f"k{i:04d}" for i in range(64)],
    "x.npy": [np.full((512, 512), i, np.float32) for i in range(64)],  # 1 MiB a sample
}
shardex.export(data, out, backend="tensordict_memmap", workers=1, samples_per_shard=64,
               storage_options=options or None)
"""


def _staged(tmp: Path) -> list[Path]:
    """Files tensordict stages for an upload, under the temporary folder ``tmp``."""
    return [  # (os.walk: folders the export removes meanwhile are skipped)
        Path(d) / name
        for d, _, names in os.walk(tmp)
        for name in names
        if "tensordict" in os.path.relpath(Path(d) / name, tmp)
    ]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_killed_export_leaves_no_staging_behind_once_another_export_runs(
    tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """SIGKILL while tensordict writes a run: its staging (``$TMPDIR`` for object storage,
    a ``.tmp-`` folder beside the run for a local output) is gone after the next export,
    and the resumed export holds only its own files."""
    import subprocess
    import sys
    import time

    s3 = request.getfixturevalue("s3") if where == "s3" else None
    out = s3.child("out") if s3 is not None else str(tmp_path / "out")
    options = s3.direct if s3 is not None else {}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "SHARDEX_LOCK_LEASE": "2"}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_EXPORT, out, json.dumps(options)], env=env
    )
    local = tmp_path / "out"

    def writing() -> bool:
        if s3 is not None:
            return bool(_staged(tmp))
        return any(".tmp-" in p.name for p in local.glob("train/*"))

    deadline = time.monotonic() + 120
    while not writing():
        assert child.poll() is None, "the export ended before it was killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(2.5)  # the killed export's lease on object storage expires
    again = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_EXPORT.replace("workers=1", "workers=1, mode='resume'"),
            out,
            json.dumps(options),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert _staged(tmp) == []
    listed = list(shardex.storage.open_storage(out, options or None).list())
    assert [p for p in listed if ".tmp-" in p] == []
    if s3 is None:
        assert not [p for p in local.rglob("*") if ".tmp-" in p.name]
    assert shardex.verify(out, storage_options=options or None).ok
