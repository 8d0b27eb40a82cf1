"""DALI index files (``.idx``) beside every shard, and reading an export with DALI.

The index files are checked against the format's published definition, as DALI's reader
parses it (``ParseIndexFile`` in NVIDIA/DALI ``dali/operators/reader/loader/
webdataset_loader.cc``) and its ``tools/wds2idx.py`` writes it: a line ``VERSION COUNT``,
then COUNT lines of whitespace-separated groups ``EXT OFFSET SIZE NAME`` (``v1.2``; ``v1.1``
has no NAME), OFFSET being where the member's data starts, a multiple of 512. Where DALI
is installed (a CPU-only pipeline runs without a GPU), it also reads exports for real.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
import shardex.dali
from shardex.dali_labels import MAX_DIGITS, WEIGHTS, ascii_label
from shardex.errors import ConfigError, MissingDependencyError
from shardex.storage import LocalStorage
from shardex.testing.data import make_image
from tests.support.s3data import S3Location


class NumpyOps:
    """:class:`~shardex.dali_labels.LabelOps` on numpy arrays (one sample): DaliOps' twin."""

    def pad(self, text: Any, width: int, fill: int) -> Any:
        return np.pad(
            np.asarray(text, dtype=np.uint8), (0, width - len(text)), constant_values=fill
        )

    def int64(self, x: Any) -> Any:
        return np.asarray(x).astype(np.int64)

    def weigh(self, digits: Any) -> Any:
        return digits * WEIGHTS

    def total(self, x: Any) -> Any:
        return np.sum(x, dtype=np.int64)

    def length(self, text: Any) -> Any:
        return np.int64(len(text))

    def pow10(self, exponent: Any) -> Any:
        return np.int64(10) ** np.int64(exponent)


Component = tuple[str, int, int, str | None]


def parse_idx(data: bytes) -> tuple[str, list[list[Component]]]:
    """An index file as DALI reads it: (version, each sample's (ext, offset, size, name))."""
    text = data.decode("utf-8")
    assert text.endswith("\n")
    head, *lines = text[:-1].split("\n")
    version, count = head.split()
    assert version in ("v1.1", "v1.2")
    assert int(count) == len(lines) > 0  # DALI wants a positive count, one line per sample
    width = 4 if version == "v1.2" else 3
    samples = []
    for line in lines:
        fields = line.split()
        assert fields
        assert len(fields) % width == 0
        sample = []
        for k in range(0, len(fields), width):
            offset, size = int(fields[k + 1]), int(fields[k + 2])
            assert offset % 512 == 0  # DALI refuses any other offset
            sample.append((fields[k], offset, size, fields[k + 3] if width == 4 else None))
        samples.append(sample)
    return version, samples


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _key(i: int, spaced: bool) -> str:
    if spaced and i in (1, 2):  # in the first shards only
        return f"with space/photo {i}"
    if i % 5 == 0:  # a GNU long-name record in the shard (the name fits no ustar field)
        return "L" * 130 + str(i)
    if i % 5 == 3:  # long, but fits ustar's prefix + name fields
        return "d" * 120 + f"/s{i:03d}"
    return f"s{i:03d}"


def make_tars(root: Path, n: int = 23, *, spaced: bool = False) -> Path:
    """WebDataset tars whose samples export to 1, 2 or 3 members: jpg; jpg + txt;
    jpg + txt + cls."""
    root.mkdir(parents=True)
    with tarfile.open(root / "a.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(n):
            key = _key(i, spaced)
            _add(tar, f"{key}.jpg", make_image(i, size=(8 + i % 9, 8 + i % 4)))
            if i % 3 >= 1:
                _add(tar, f"{key}.txt", f"caption {i}".encode() * (i % 200))
            if i % 3 == 2:
                _add(tar, f"{key}.cls", str(i % 4).encode())
    return root


def _split_ext(name: str) -> str:
    return name[name.find(".", name.rfind("/") + 1) + 1 :]


def _check_shards(out: Path, split: str = "train") -> int:
    """Every .idx of a split against tarfile's member offsets, shardex's own index and the
    bytes shardex reads; returns the number of samples checked."""
    ds = shardex.open_dataset(out, split=split)
    records = ds.index.samples  # type: ignore[attr-defined]
    first = 0
    for number, shard in enumerate(ds.config.splits[split].shards):
        assert shard.dali_index == shard.path.removesuffix(".tar") + ".idx"
        version, samples = parse_idx((out / shard.dali_index).read_bytes())
        assert len(samples) == shard.num_samples
        with tarfile.open(out / shard.path) as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
        tar_bytes = (out / shard.path).read_bytes()
        mine = records[first : first + shard.num_samples]
        assert (mine["shard"] == number).all()
        for i, (components, record) in enumerate(zip(samples, mine, strict=True)):
            start, end = int(record["offset"]), int(record["offset"] + record["length"])
            inside = [m for m in members if start <= m.offset < end]
            assert [(c[1], c[2]) for c in components] == [(m.offset_data, m.size) for m in inside]
            assert [c[0] for c in components] == [_split_ext(m.name) for m in inside]
            if version == "v1.2":
                assert [c[3] for c in components] == [m.name for m in inside]
            sample = ds[first + i]
            for ext, offset, size, _ in components:
                assert start < offset
                assert offset + size <= end
                assert tar_bytes[offset : offset + size] == sample[ext]
        first += shard.num_samples
    return first


@pytest.mark.parametrize("per_shard", [1, 4, 7, 100])
def test_index_files_point_exactly_at_every_member(tmp_path: Path, per_shard: int) -> None:
    src = make_tars(tmp_path / "src")
    config = shardex.export(src, tmp_path / "out", samples_per_shard=per_shard, workers=1)
    assert _check_shards(tmp_path / "out") == 23
    counts = {len(s) for s in _all_samples(tmp_path / "out", config)}
    assert counts == {1, 2, 3}


def _all_samples(out: Path, config: shardex.ExportConfig) -> list[list[Component]]:
    found = []
    for shard in config.splits["train"].shards:
        assert shard.dali_index is not None
        found += parse_idx((out / shard.dali_index).read_bytes())[1]
    return found


def test_index_files_of_the_demo_have_image_label_and_metadata(tmp_path: Path) -> None:
    config = shardex.export(
        "demo:40",
        tmp_path / "out",
        samples_per_shard=9,
        workers=1,
        split_fractions={"a": 0.7, "b": 0.3},
    )
    assert sum(_check_shards(tmp_path / "out", split) for split in ("a", "b")) == 40
    version, samples = parse_idx(
        (tmp_path / "out" / config.splits["a"].shards[0].dali_index).read_bytes()
    )  # type: ignore[operator]
    assert version == "v1.2"
    assert [c[0] for c in samples[0]][1:] == ["cls", "json"]


def test_names_with_spaces_give_the_nameless_version(tmp_path: Path) -> None:
    src = make_tars(tmp_path / "src", spaced=True)
    config = shardex.export(src, tmp_path / "out", samples_per_shard=4, workers=1)
    assert _check_shards(tmp_path / "out") == 23
    versions = {
        parse_idx((tmp_path / "out" / s.dali_index).read_bytes())[0]  # type: ignore[operator]
        for s in config.splits["train"].shards
    }
    assert versions == {"v1.1", "v1.2"}  # v1.1 only where a name holds a space


def test_index_files_are_byte_identical_across_exports(tmp_path: Path) -> None:
    src = make_tars(tmp_path / "src")
    for name in ("one", "two"):
        shardex.export(src, tmp_path / name, samples_per_shard=5, workers=1 if name == "one" else 2)
    one = sorted((tmp_path / "one").rglob("*.idx"))
    assert len(one) == 5
    for path in one:
        assert (
            tmp_path / "two" / path.relative_to(tmp_path / "one")
        ).read_bytes() == path.read_bytes()


def test_resume_rewrites_a_missing_or_damaged_index_file(tmp_path: Path) -> None:
    src = make_tars(tmp_path / "src")
    shardex.export(src, tmp_path / "clean", samples_per_shard=5, workers=1)
    out = tmp_path / "out"
    shutil.copytree(tmp_path / "clean", out)
    (out / "config.yaml").unlink()  # as if killed before the commit
    idx = sorted(out.rglob("*.idx"))
    idx[0].unlink()
    idx[1].write_bytes(b"v1.2 1\njpg 0 1 x.jpg\n")
    shardex.export(src, out, samples_per_shard=5, workers=1, mode="resume")
    for path in sorted((tmp_path / "clean").rglob("*")):
        if path.is_file():
            assert (out / path.relative_to(tmp_path / "clean")).read_bytes() == path.read_bytes()


def test_append_and_overwrite_keep_index_files_in_step(tmp_path: Path) -> None:
    src = make_tars(tmp_path / "src")
    more = tmp_path / "more"
    more.mkdir()
    with tarfile.open(more / "b.tar", "w") as tar:
        for i in range(6):  # the keys of the export (image, txt, label), as append requires
            _add(tar, f"extra{i}.jpg", make_image(100 + i))
            _add(tar, f"extra{i}.txt", b"more")
            _add(tar, f"extra{i}.cls", b"1")
    out = tmp_path / "out"
    shardex.export(src, out, samples_per_shard=5, workers=1)
    config = shardex.export(more, out, samples_per_shard=5, workers=1, mode="append")
    assert len(config.splits["train"].shards) == 7
    assert _check_shards(out) == 29
    assert shardex.verify(out).ok
    shardex.export(more, out, samples_per_shard=5, workers=1, mode="overwrite")
    assert len(list(out.rglob("*.idx"))) == 2  # the replaced export's index files are gone
    assert _check_shards(out) == 6


def test_verify_finds_a_damaged_index_file(tmp_path: Path) -> None:
    shardex.export("demo:20", tmp_path / "out", samples_per_shard=8, workers=1)
    assert shardex.verify(tmp_path / "out").ok
    path = sorted((tmp_path / "out").rglob("*.idx"))[1]
    text = path.read_bytes()
    path.write_bytes(text.replace(b" 512 ", b" 1024 ", 1))
    report = shardex.verify(tmp_path / "out")
    assert [(p.file, p.kind) for p in report.problems] == [
        (str(path.relative_to(tmp_path / "out")), "dali-index")
    ]
    path.unlink()
    assert [p.kind for p in shardex.verify(tmp_path / "out").problems] == ["dali-index"]


def test_exports_without_index_files_still_read(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardex.export("demo:20", out, samples_per_shard=8, workers=1)
    text = (out / "config.yaml").read_text()
    (out / "config.yaml").write_text(
        "\n".join(line for line in text.splitlines() if "dali_index:" not in line) + "\n"
    )
    for path in out.rglob("*.idx"):
        path.unlink()
    assert len(shardex.open_dataset(out)) == 20
    assert shardex.verify(out).ok
    args = shardex.dali.reader_arguments(out)
    assert args.index_paths is None  # DALI scans the tars itself
    assert "index_paths" not in args.as_kwargs()
    assert len(args.paths) == 3


def test_reader_arguments_for_local_mounted_and_remote_exports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = shardex.export("demo:20", out, samples_per_shard=8, workers=1)
    shards = config.splits["train"].shards
    local = shardex.dali.reader_arguments(out)
    assert local.ext == ("jpg;png;webp", "cls")
    assert local.paths == tuple(str(out / s.path) for s in shards)
    assert local.index_paths == tuple(str(out / str(s.dali_index)) for s in shards)

    mounted = shardex.dali.reader_arguments(_Remote(out, "gs://bucket/x"), shard_root="/mnt/x")
    assert mounted.paths == tuple(f"/mnt/x/{s.path}" for s in shards)

    with pytest.raises(ConfigError, match="shard_root"):
        shardex.dali.reader_arguments(_Remote(out, "gs://bucket/x"))

    remote = shardex.dali.reader_arguments(_Remote(out, "s3://bucket/x"), ext=["jpg"])
    assert remote.paths == tuple(f"s3://bucket/x/{s.path}" for s in shards)
    assert remote.ext == ("jpg",)
    assert remote.index_paths is not None
    cache = Path(os.environ["SHARDEX_CACHE_DIR"])
    for staged, shard in zip(remote.index_paths, shards, strict=True):
        assert Path(staged).is_relative_to(cache)
        assert Path(staged).read_bytes() == (out / str(shard.dali_index)).read_bytes()


class _Remote(LocalStorage):
    """A local folder that calls itself a remote URL and offers no local files."""

    def __init__(self, root: Path, uri: str) -> None:
        super().__init__(root)
        self.uri = uri

    def local_path(self, path: str) -> None:  # type: ignore[override]
        return None


def test_pipeline_without_dali_names_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali.fn", None)  # import fails as if absent
    with pytest.raises(MissingDependencyError, match=r"shardex\[dali\]"):
        shardex.dali.pipeline(tmp_path, batch_size=2)


# ---------------------------------------------------------------- labels (no DALI needed)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**MAX_DIGITS - 1))
def test_ascii_labels_parse_to_their_integer(label: int) -> None:
    text = np.frombuffer(str(label).encode(), dtype=np.uint8)
    assert int(ascii_label(text, NumpyOps())) == label


def test_the_labels_of_an_export_parse_and_a_missing_one_is_minus_one(tmp_path: Path) -> None:
    shardex.export("demo:12", tmp_path / "o", workers=1)
    stored = [s["cls"] for s in shardex.open_dataset(tmp_path / "o")]
    parsed = [int(ascii_label(np.frombuffer(b, dtype=np.uint8), NumpyOps())) for b in stored]
    assert parsed == [int(b) for b in stored]
    assert not all(p == parsed[0] for p in parsed)  # several classes, not one constant
    assert int(ascii_label(np.zeros(0, dtype=np.uint8), NumpyOps())) == -1


# ---------------------------------------------------------------- with DALI installed


def _outputs(pipe: Any, batches: int) -> list[tuple[bytes, ...]]:
    rows = []
    for _ in range(batches):
        outs = pipe.run()
        rows += [tuple(np.array(o.at(i)).tobytes() for o in outs) for i in range(len(outs[0]))]
    return rows


def test_dali_reads_every_sample_through_the_index_files(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    src = make_tars(tmp_path / "src")
    out = tmp_path / "out"
    shardex.export(src, out, samples_per_shard=4, workers=1)
    pipe = shardex.dali.pipeline(out, batch_size=23, ext=["jpg", "txt", "cls"], num_threads=1)
    got = _outputs(pipe, 1)
    label = [
        np.array(int(s["cls"]) if "cls" in s else -1, dtype=np.int64).tobytes()
        for s in shardex.open_dataset(out)
    ]
    expected = [
        (s["jpg"], s.get("txt", b""), lab)
        for s, lab in zip(shardex.open_dataset(out), label, strict=True)
    ]
    assert got == expected  # missing members come back empty (DALI's default), labels -1


def test_dali_labels_are_the_integers_stored_many_digits_included(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    stored = [0, 7, 10, 42, 99, 100, 1234, 65535, 999_999_999, None, 3]
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(src / "a.tar", "w") as tar:
        for i, label in enumerate(stored):
            _add(tar, f"s{i:03d}.jpg", make_image(i))
            if label is not None:
                _add(tar, f"s{i:03d}.cls", str(label).encode())
    out = tmp_path / "out"
    shardex.export(src, out, samples_per_shard=4, workers=1)
    pipe = shardex.dali.pipeline(out, batch_size=len(stored), ext=["jpg", "cls"], num_threads=1)
    images, labels = pipe.run()
    got = [np.array(labels.at(i)) for i in range(len(stored))]
    assert {g.dtype for g in got} == {np.dtype(np.int64)}
    assert [int(g) for g in got] == [-1 if lab is None else lab for lab in stored]
    jpgs = [s["jpg"] for s in shardex.open_dataset(out)]
    assert [np.array(images.at(i)).tobytes() for i in range(len(stored))] == jpgs
    raw = shardex.dali.pipeline(
        out, batch_size=len(stored), ext=["cls"], num_threads=1, int_labels=False
    )
    (text,) = raw.run()
    assert np.array(text.at(1)).tobytes() == b"7"  # the stored ASCII, when asked for


def test_dali_reads_a_spaced_names_export_and_a_mounted_copy(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    src = make_tars(tmp_path / "src", spaced=True)
    out = tmp_path / "out"
    shardex.export(src, out, samples_per_shard=6, workers=1)
    mount = tmp_path / "mount"
    shutil.copytree(out, mount)
    pipe = shardex.dali.pipeline(
        _Remote(out, "az://container/x"), batch_size=23, ext=["jpg"], shard_root=mount
    )
    assert [row[0] for row in _outputs(pipe, 1)] == [s["jpg"] for s in shardex.open_dataset(out)]


def test_dali_refuses_an_endpoint_it_would_not_use(s3: S3Location) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    shardex.export("demo:12", s3.url, storage_options=s3.direct, samples_per_shard=6, workers=1)
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL"):
        shardex.dali.pipeline(s3.url, batch_size=4, storage_options=s3.direct, stage=False)


_S3_READ = """
import json, sys
import numpy as np
import shardex.dali
options = json.loads(sys.argv[2])
pipe = shardex.dali.pipeline(sys.argv[1], batch_size=12, num_threads=1, storage_options=options)
image, label = pipe.run()
print(json.dumps([[np.array(image.at(i)).tobytes().hex(), int(np.array(label.at(i)))]
                  for i in range(len(label))]))
"""


def test_dali_reads_shards_from_s3_with_staged_index_files(s3: S3Location) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    shardex.export("demo:12", s3.url, storage_options=s3.direct, samples_per_shard=5, workers=1)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3.direct["endpoint_url"],
        "AWS_ACCESS_KEY_ID": s3.direct["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3.direct["secret_access_key"],
        "AWS_REGION": s3.direct["region"],
    }
    # A process of its own: DALI makes one S3 client per process, from the environment.
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_S3_READ), s3.url, json.dumps(s3.direct)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.splitlines()[-1])
    ds = shardex.open_dataset(s3.url, storage_options=s3.direct)
    expected = [[_image(s).hex(), int(s["cls"])] for s in ds]
    assert rows == expected


def _image(sample: dict[str, Any]) -> bytes:
    return next(v for k, v in sample.items() if k in ("jpg", "png", "webp"))


def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).resolve().parents[2] / "docs" / "dali.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    scope: dict[str, Any] = {}
    exec(compile(code.replace('"demo:300"', '"demo:120"'), "docs/dali.md", "exec"), scope)
    assert len(scope["images"]) == 32
    assert 0 <= scope["first_label"] < 10


def _stagings() -> set[str]:
    from shardex.dali_staging import PREFIX

    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(PREFIX)}


def test_staging_downloads_a_split_with_the_storage_options_and_removes_it(
    s3: S3Location,
) -> None:
    """No DALI needed: the staging is shardex's own."""
    from shardex.dali_staging import Staging
    from shardex.storage import open_storage

    shardex.export(
        "demo:12", s3.url, storage_options=s3.direct, samples_per_shard=5,
        split_fractions={"train": 0.5, "val": 0.5},
    )  # fmt: skip
    storage = open_storage(s3.url, s3.direct)
    shards = shardex.read_config(storage).split("val").shards
    before = _stagings()
    staging = Staging(storage, shards)
    assert staging.path.name in _stagings() - before
    for shard in shards:
        assert (staging.path / shard.path).read_bytes() == storage.get(shard.path)
        assert shard.dali_index is not None
        assert (staging.path / shard.dali_index).read_bytes() == storage.get(shard.dali_index)
    staging.close()
    staging.close()
    assert not staging.path.exists()


_KILLED_STAGING = """
import json, os, sys
from shardex.dali_staging import Staging
from shardex.storage import open_storage
import shardex
storage = open_storage(sys.argv[1], json.loads(sys.argv[2]))
staging = Staging(storage, shardex.read_config(storage).split("train").shards)
print(staging.path, flush=True)
os._exit(9)  # killed: nothing removes the folder
"""


def test_the_staging_of_a_killed_run_is_removed_by_the_next_one(s3: S3Location) -> None:
    from shardex.dali_staging import Staging
    from shardex.storage import open_storage

    shardex.export("demo:6", s3.url, storage_options=s3.direct, samples_per_shard=3)
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_STAGING, s3.url, json.dumps(s3.direct)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    left = Path(done.stdout.strip())
    assert left.is_dir() and any(left.rglob("*.tar"))
    storage = open_storage(s3.url, s3.direct)
    staging = Staging(storage, shardex.read_config(storage).split("train").shards)
    assert not left.exists()
    staging.close()


def test_dali_reads_s3_with_the_storage_options_and_leaves_no_staging(s3: S3Location) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    from shardex.spec import DALILoader, DataSpec, ExportedDataset, LoaderSpec

    shardex.export("demo:10", s3.url, storage_options=s3.direct, samples_per_shard=4)
    before = _stagings()
    # no AWS_* variables: DALI's S3 client would not find this server; the options do
    source = ExportedDataset(
        s3.url, feature_keys=["image"], label_keys=["label"],
        s3_endpoint_url=s3.direct["endpoint_url"], s3_region=s3.direct["region"],
        storage_options={k: s3.direct[k] for k in ("access_key_id", "secret_access_key")},
    )  # fmt: skip
    spec = DataSpec(source, LoaderSpec(DALILoader(batch_size=4, image_size=(8, 8))))
    labels = [label for _, targets in spec for label in targets["label"].tolist()]
    ds = shardex.open_dataset(s3.url, decode=True, storage_options=s3.direct)
    assert labels == [s["cls"] for s in ds]
    assert _stagings() == before
