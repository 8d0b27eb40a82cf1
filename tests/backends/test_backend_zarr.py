"""The ``zarr`` backend: the conformance suite, plain-zarr readers, image codecs, and the
number of store requests a random read costs."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import shardex
from shardex.errors import ChecksumError, ConfigError, ObjectNotFoundError
from shardex.storage import LocalStorage
from shardex.testing import BackendTests
from shardex.testing.backend import array_data
from shardex.testing.data import make_image
from tests.support.s3data import S3Location


class TestZarr(BackendTests):
    backend_name = "zarr"


# The recipe docs/backends.md gives to people who read the arrays without shardex.
PLAIN_READER = textwrap.dedent(
    """
    import sys
    import numpy as np, zarr, zarr.registry, imagecodecs.numcodecs
    from zarr.codecs.numcodecs import _NumcodecsArrayBytesCodec

    imagecodecs.numcodecs.register_codecs(verbose=False)
    for cid in ("imagecodecs_png", "imagecodecs_webp", "imagecodecs_jpeg"):
        cls = type(cid, (_NumcodecsArrayBytesCodec,), {}, codec_name=cid)
        zarr.registry.register_codec(f"numcodecs.{cid}", cls)

    assert "shardex" not in sys.modules
    np.save(sys.argv[2], zarr.open_group(sys.argv[1], mode="r")["image"][:])
    """
)


def _group(out: Path, split: str = "train") -> zarr.Group:
    path = shardex.read_config(out).split(split).shards[0].path
    return zarr.open_group(out / path, mode="r")


def _images(n: int, smooth: bool = False) -> np.ndarray:
    if not smooth:
        return np.random.default_rng(1).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    y, x = np.mgrid[0:32, 0:32]
    return np.stack(
        [np.stack([(x * 8 + i) % 256, (y * 8) % 256, (x + y + i) * 4 % 256], -1) for i in range(n)]
    ).astype(np.uint8)


def _plain_sample(group: zarr.Group, i: int) -> dict[str, Any]:
    """Sample ``i`` rebuilt with plain zarr from the group's attributes alone."""
    meta = group.attrs["shardex"]
    nodes = meta["columns"]

    def ragged(column: str) -> np.ndarray:
        offsets = group[nodes[f"{column}.offsets"]]
        start, end = (int(v) for v in offsets[i : i + 2])
        return np.asarray(group[nodes[f"{column}.data"]][start:end])

    key = ragged("__key__").tobytes().decode()
    out: dict[str, Any] = {"__key__": key}
    for field in meta["fields"]:
        column, present = field["column"], f"{field['column']}.present"
        if field["optional"] and not group[nodes[present]][i]:
            continue
        if field["kind"] != "bytes" and None not in field["shape"]:
            out[field["name"]] = np.asarray(group[nodes[column]][i])
        elif field["kind"] == "array":
            shape = tuple(int(d) for d in group[nodes[f"{column}.shapes"]][i])
            out[field["name"]] = ragged(column).reshape(shape)
        else:
            out[field["name"]] = ragged(column).tobytes()
    return out


def test_plain_zarr_reads_what_shardex_reads(tmp_path: Path) -> None:
    shardex.export(array_data(), tmp_path / "o", backend="zarr", workers=1)
    ds = shardex.open_dataset(tmp_path / "o", split="train")
    group = _group(tmp_path / "o")
    assert "key.data" in group
    assert "__key__.data" not in group
    for i in range(len(ds)):
        ours, plain = ds[i], _plain_sample(group, i)
        assert set(ours) == set(plain)
        for name, value in ours.items():
            if name.endswith(".npy"):
                want = np.load(io.BytesIO(value))
                assert plain[name].dtype == want.dtype, name
                np.testing.assert_array_equal(plain[name], want)
            elif name == "cls":
                assert int(plain[name]) == int(value)
            else:
                assert plain[name] == value, name


def test_encoded_images_stay_byte_exact_in_plain_zarr(tmp_path: Path) -> None:
    blobs = [make_image(i, size=(20 + i, 12 + i % 5)) for i in range(20)]
    shardex.export({"jpg": blobs}, tmp_path / "o", backend="zarr", workers=1)
    group = _group(tmp_path / "o")
    offsets, data = group["jpg.offsets"][:], group["jpg.data"][:]
    keys = shardex.open_dataset(tmp_path / "o", split="train")
    got = {
        keys[i]["__key__"]: data[offsets[i] : offsets[i + 1]].tobytes() for i in range(len(keys))
    }
    assert got == {f"{i:06d}": b for i, b in enumerate(blobs)}


@pytest.mark.parametrize("codec", ["png", "webp"])
def test_lossless_image_codecs_round_trip(codec: str, tmp_path: Path) -> None:
    images = _images(12)
    out = tmp_path / "o"
    shardex.export(
        {"image": images}, out, backend="zarr", workers=1, backend_options={"image_codec": codec}
    )
    ds = shardex.open_dataset(out, split="train", decode=True)
    np.testing.assert_array_equal(np.stack([s["image.npy"] for s in ds]), images)
    (inner,) = _group(out)["image"].metadata.codecs[0].codecs[:1]  # sharding -> its codecs
    assert inner.to_dict()["name"] == f"numcodecs.imagecodecs_{codec}"
    # a fresh interpreter with zarr + imagecodecs only, as a user without shardex has
    path = shardex.read_config(out).split("train").shards[0].path
    subprocess.run(
        [sys.executable, "-c", PLAIN_READER, str(out / path), str(tmp_path / "plain.npy")],
        check=True,
        capture_output=True,
    )
    np.testing.assert_array_equal(np.load(tmp_path / "plain.npy"), images)


def test_jpeg_codec_is_lossy_but_close(tmp_path: Path) -> None:
    images = _images(6, smooth=True)
    options = {"image_codec": "jpeg", "image_quality": "95"}  # strings, as the CLI gives
    shardex.export({"image": images}, tmp_path / "o", backend="zarr", backend_options=options)
    ds = shardex.open_dataset(tmp_path / "o", split="train", decode=True)
    got = np.stack([s["image.npy"] for s in ds]).astype(np.int16)
    assert got.shape == images.shape
    assert np.abs(got - images).mean() < 4


def test_bad_image_options_are_refused_before_writing(tmp_path: Path) -> None:
    grey = {"image": np.zeros((3, 8, 8, 1), np.uint8)}
    with pytest.raises(ConfigError, match="webp cannot store 1-channel"):
        shardex.export(
            grey, tmp_path / "a", backend="zarr", backend_options={"image_codec": "webp"}
        )
    with pytest.raises(ConfigError, match="image_codec must be one of"):
        shardex.export(grey, tmp_path / "b", backend="zarr", backend_options={"image_codec": "gif"})
    with pytest.raises(ConfigError, match="image_quality"):
        shardex.export(grey, tmp_path / "c", backend="zarr", backend_options={"image_quality": 0})
    assert not (tmp_path / "a" / "config.yaml").exists()


class _Counting(LocalStorage):
    """A local storage that counts the reads zarr makes through it."""

    reads: list[tuple[str, int, int]]

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self.reads = []

    def get(self, path: str) -> bytes:
        self.reads.append((path, 0, -1))
        return super().get(path)

    def get_range(self, path: str, start: int, length: int) -> bytes:
        self.reads.append((path, start, length))
        return super().get_range(path, start, length)

    def size(self, path: str) -> int:
        self.reads.append((path, -1, -1))
        return super().size(path)


def test_one_random_image_costs_two_requests(tmp_path: Path) -> None:
    images = _images(300)
    data = {"image": images, "label": [i % 5 for i in range(300)]}
    shardex.export(data, tmp_path / "o", backend="zarr", backend_options={"image_codec": "png"})
    storage = _Counting(tmp_path / "o")
    ds = shardex.open_dataset(storage, split="train", decode=True)
    ds[0]  # opening the split reads every array's zarr.json and the small arrays once
    opened = len(storage.reads)
    for i in random.Random(0).sample(range(len(ds)), k=10):
        storage.reads.clear()
        sample = ds[i]
        np.testing.assert_array_equal(sample["image.npy"], images[int(sample["__key__"])])
        print(f"zarr: one random image read = {len(storage.reads)} store requests")
        # the shard index (at the start of the shard), then the one chunk of the image
        assert len(storage.reads) == 2
        (index_path, index_start, _), (chunk_path, _, chunk_length) = storage.reads
        assert index_path == chunk_path
        assert index_start == 0
        assert chunk_length < images[0].nbytes + 1024
    print(f"zarr: opening the split = {opened} store requests")


def test_one_random_encoded_image_sample_costs_few_requests(tmp_path: Path) -> None:
    blobs = [make_image(i, size=(40 + i % 30, 30)) for i in range(200)]
    data = {"jpg": blobs, "label": [i % 3 for i in range(200)], "caption": ["a cat"] * 200}
    shardex.export(data, tmp_path / "o", backend="zarr", workers=1)
    storage = _Counting(tmp_path / "o")
    ds = shardex.open_dataset(storage, split="train")
    ds[0]
    counts = []
    for i in random.Random(0).sample(range(len(ds)), k=20):
        storage.reads.clear()
        assert ds[i]["jpg"] == blobs[int(ds[i]["__key__"])]
        storage.reads.clear()
        ds[i]
        counts.append(len(storage.reads))
    print(f"zarr: one random sample (jpg bytes + caption + label) = {max(counts)} requests")
    # per ragged field: the shard index, then the one or two chunks its bytes fall in
    assert max(counts) <= 6


def test_damage_is_an_error_never_zeros(tmp_path: Path) -> None:
    out = tmp_path / "o"
    shardex.export({"image": _images(8)}, out, backend="zarr")
    assert shardex.verify(out).ok
    chunk = next(p for p in out.rglob("*") if "/image/c/" in p.as_posix() and p.is_file())
    data = bytearray(chunk.read_bytes())
    data[-10] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert not shardex.verify(out).ok
    with pytest.raises(ChecksumError, match="image"):
        list(shardex.open_dataset(out, split="train"))
    chunk.unlink()
    with pytest.raises(ObjectNotFoundError):
        shardex.open_dataset(out, split="train")[3]


def test_s3_export_is_identical_and_reads_two_ranged_gets(s3: S3Location, tmp_path: Path) -> None:
    from shardex.storage import ObjectStorage

    data = {"image": _images(40), "label": [i % 4 for i in range(40)]}
    options = {"image_codec": "png"}
    shardex.export(data, tmp_path / "local", backend="zarr", backend_options=options)
    shardex.export(data, s3.url, backend="zarr", backend_options=options, storage_options=s3.direct)
    remote = ObjectStorage(s3.url, s3.direct)
    local = {
        p.relative_to(tmp_path / "local").as_posix(): p for p in (tmp_path / "local").rglob("*")
    }
    assert {name: remote.get(name) for name in remote.list()} == {
        name: p.read_bytes() for name, p in local.items() if p.is_file()
    }
    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.counted, decode=True)
    ds[0]
    s3.proxy.wait_idle()
    assert s3.proxy.lists() == []
    for i in random.Random(2).sample(range(len(ds)), k=5):
        s3.proxy.reset()
        np.testing.assert_array_equal(ds[i]["image.npy"], data["image"][int(ds[i]["__key__"])])
        s3.proxy.reset()
        ds[i]
        s3.proxy.wait_idle()
        gets = s3.proxy.gets()
        assert len(s3.proxy.requests) == len(gets) == 2  # the shard's index, then the image
        assert all(r.range is not None for r in gets)


# A user's script: plain zarr, shardex installed but never imported by the script.
ENTRY_POINT_READER = textwrap.dedent(
    """
    import sys
    import numpy as np, zarr

    group = zarr.open_group(sys.argv[1], mode="r")
    assert "shardex" not in sys.modules
    np.save(sys.argv[2], group["image"][:])
    assert "shardex.codecs.zarr_images" in sys.modules  # what zarr's entry point loaded
    """
)


def _declared_codecs() -> dict[str, str]:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    codecs: dict[str, str] = pyproject["project"]["entry-points"]["zarr.codecs"]
    return codecs


def _installed_as_declared(tmp_path: Path) -> Path:
    """A folder holding shardex's distribution metadata with the entry points pyproject.toml
    declares (what ``pip install`` writes), to put before site-packages: the installed copy's
    metadata is as old as its last install."""
    info = tmp_path / "meta" / "shardex-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shardex\nVersion: 0.1.0\n")
    lines = [f"{name} = {target}" for name, target in _declared_codecs().items()]
    (info / "entry_points.txt").write_text("[zarr.codecs]\n" + "\n".join(lines) + "\n")
    return info.parent


@pytest.mark.parametrize("codec", ["png", "webp", "jpeg"])
def test_plain_zarr_decodes_images_through_entry_points(codec: str, tmp_path: Path) -> None:
    images = _images(5, smooth=True)
    out = tmp_path / "o"
    options = {"image_codec": codec, "image_quality": 100}
    shardex.export({"image": images}, out, backend="zarr", workers=1, backend_options=options)
    src = Path(shardex.__file__).parents[1]
    env = {"PYTHONPATH": f"{_installed_as_declared(tmp_path)}:{src}", "PATH": ""}
    path = shardex.read_config(out).split("train").shards[0].path
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", ENTRY_POINT_READER, str(out / path), "plain.npy"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    want = shardex.open_dataset(out, split="train", decode=True)
    got = np.load(tmp_path / "plain.npy")
    np.testing.assert_array_equal(got, np.stack([s["image.npy"] for s in want]))
    if codec != "jpeg":
        np.testing.assert_array_equal(got, images)


def test_each_image_codec_has_an_entry_point() -> None:
    from shardex.codecs import zarr_images

    declared = _declared_codecs()
    assert set(declared) == {f"numcodecs.imagecodecs_{n}" for n in zarr_images._CLASSES}
    for name, target in declared.items():
        module, _, attr = target.partition(":")
        assert module == zarr_images.__name__
        assert getattr(zarr_images, attr).codec_name == name


@pytest.mark.filterwarnings("always::shardex.errors.ShardexWarning")  # shown, as to a user
def test_an_image_codec_with_only_encoded_images_says_it_does_nothing(tmp_path: Path) -> None:
    """The codec applies to fixed-shape pixel arrays; a source of encoded images of
    different sizes keeps its bytes, and the user is told so instead of left guessing."""
    from click.testing import CliRunner

    from shardex.cli import main

    args = ["export-dataset", "demo:30", "-o", str(tmp_path / "z"), "-q", "--backend", "zarr"]
    done = CliRunner().invoke(main, [*args, "--backend-option", "image_codec=webp"])
    assert done.exit_code == 0, done.output
    warned = [line for line in done.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "image_codec=webp applies to fixed-shape" in warned[0]
