"""``image_member``: one member name for images of mixed formats, read by Hugging Face
``datasets`` and Ray Data with their stock WebDataset readers, and by shardex itself.

Without it, the demo's jpg/png/webp samples give those readers one sparse column per
extension: ``datasets`` keeps only the column of the first shard's format (the other rows
lose their image) and Ray's default decoder fails to cast the ``jpg`` column.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

import shardex
from helpers import RAY_DATA_WARNINGS, files_of, image_bytes
from shardex.cli import main
from shardex.codecs.images import IMAGE_EXTENSIONS, decode
from shardex.errors import ConfigError
from tests.support.raycluster import local_ray_cluster

FORMATS = {"jpg": "jpeg", "png": "png", "webp": "webp"}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo exported as it is (mixed members) and with ``image_member="jpg"``."""
    root = tmp_path_factory.mktemp("image-member")
    shardex.export("demo:40", root / "mixed", samples_per_shard=15, workers=1)
    shardex.export("demo:40", root / "one", samples_per_shard=15, workers=1, image_member="jpg")
    return root / "mixed", root / "one"


def _images(out: Path) -> dict[str, tuple[str, bytes]]:
    """key -> (member extension, stored bytes) of every sample's image."""
    found = {}
    for sample in shardex.open_dataset(out):
        (ext,) = [e for e in sample if e in FORMATS]
        found[sample["__key__"]] = (ext, sample[ext])
    return found


def _tars(out: Path) -> list[str]:
    return sorted(str(p) for p in (out / "train").glob("*.tar"))


def test_every_image_is_one_member_with_its_bytes_and_format_kept(
    exports: tuple[Path, Path],
) -> None:
    mixed, one = exports
    before, after = _images(mixed), _images(one)
    assert {ext for ext, _ in before.values()} == set(FORMATS)  # the demo mixes formats
    assert {ext for ext, _ in after.values()} == {"jpg"}
    assert {k: data for k, (_, data) in after.items()} == {
        k: data for k, (_, data) in before.items()
    }  # not re-encoded
    table = pq.read_table(one / "metadata.parquet")
    formats = dict(zip(table["key"].to_pylist(), table["image_format"].to_pylist(), strict=True))
    assert formats == {k: FORMATS[ext] for k, (ext, _) in before.items()}
    for sample in shardex.open_dataset(one):  # also in each sample's .json member
        assert sample["json"].endswith(f'"image_format":"{formats[sample["__key__"]]}"}}'.encode())
    config = yaml.safe_load((one / "config.yaml").read_text())
    assert config["shard_options"]["image_member"] == "jpg"
    (spec,) = [s for s in config["key_specs"] if s["key"] == "image"]
    assert (spec["encoding"], spec["storage"]) == ("jpeg|png|webp", "tar:jpg")
    assert shardex.verify(one, deep=True).ok


def test_shardex_readers_decode_by_content(exports: tuple[Path, Path]) -> None:
    pytest.importorskip("torch")
    from shardex.torch import MapDataset

    mixed, one = exports
    want = {k: decode(data) for k, (_, data) in _images(mixed).items()}
    keys = [s["__key__"] for s in shardex.open_dataset(one)]
    got = MapDataset(one, decode=True)
    assert len(got) == len(keys) == 40
    for i, key in enumerate(keys):
        image = got[i]["image"]
        assert np.array_equal(image.numpy(), want[key]), key


def test_hugging_face_datasets_reads_every_row_with_its_image(
    exports: tuple[Path, Path], tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    mixed, one = exports
    want = {k: decode(data) for k, (_, data) in _images(mixed).items()}
    files = {"train": _tars(one)}
    for streaming in (False, True):
        rows = list(
            datasets.load_dataset(
                "webdataset",
                data_files=files,
                split="train",
                streaming=streaming,
                cache_dir=str(tmp_path / "hf"),
            )
        )
        assert len(rows) == 40
        for row in rows:
            assert np.array_equal(np.asarray(row["jpg"]), want[row["__key__"]]), row["__key__"]
            assert row["json"]["image_format"] in FORMATS.values()
    # without the option, rows lose their image (the failure this option is for)
    lost = datasets.load_dataset(
        "webdataset", data_files={"train": _tars(mixed)}, split="train", cache_dir=str(tmp_path)
    )
    assert sum(row["jpg"] is None for row in lost) == sum(
        1 for ext, _ in _images(mixed).values() if ext != "jpg"
    )


def test_wids_default_decoder_decodes_every_image(exports: tuple[Path, Path]) -> None:
    import functools

    wids = pytest.importorskip("wids")
    mixed, one = exports
    want = {k: decode(data) for k, (_, data) in _images(mixed).items()}
    train = shardex.open_dataset(one).config.split("train")
    shards = [{"url": str(one / s.path), "nsamples": s.num_samples} for s in train.shards]
    pil = functools.partial(wids.wids.default_decoder, format="PIL")
    dataset = wids.ShardListDataset(shards, transformations=[pil])
    try:
        assert len(dataset) == 40
        for i in range(40):
            sample = dataset[i]
            assert np.array_equal(np.asarray(sample[".jpg"]), want[sample["__key__"]])
    finally:
        dataset.close()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    pytest.importorskip("ray")
    with local_ray_cluster(num_cpus=1):
        yield


@pytest.mark.usefixtures("ray_cluster")
@RAY_DATA_WARNINGS[0]
@RAY_DATA_WARNINGS[1]
@RAY_DATA_WARNINGS[2]
def test_ray_data_reads_every_row_with_its_image(exports: tuple[Path, Path]) -> None:
    import ray.data

    mixed, one = exports
    want = {k: decode(data) for k, (_, data) in _images(mixed).items()}
    rows: list[dict[str, Any]] = ray.data.read_webdataset(_tars(one)).take_all()
    assert sorted(r["__key__"] for r in rows) == sorted(want)
    for row in rows:
        assert np.array_equal(row["jpg"], want[row["__key__"]]), row["__key__"]
    with pytest.raises(Exception, match="cast column jpg"):  # without the option
        ray.data.read_webdataset(_tars(mixed)).take_all()


def test_append_keeps_the_member_name(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shardex.export("demo:20", out, workers=1, image_member="jpg")
    config = shardex.export("demo:30", out, workers=1, mode="append", on_error="skip")
    assert config.shard_options["image_member"] == "jpg"
    exts = {e for s in shardex.open_dataset(out) for e in s if e in FORMATS}
    assert exts == {"jpg"}


def test_cli_flag_and_bad_names(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["export-dataset", "demo:12", "-o", str(tmp_path / "o"), "--image-member", "png", "-q"],
    )
    assert result.exit_code == 0, result.output
    assert {e for s in shardex.open_dataset(tmp_path / "o") for e in s if e in FORMATS} == {"png"}
    bad = CliRunner().invoke(
        main, ["export-dataset", "demo:12", "-o", str(tmp_path / "b"), "--image-member", "image"]
    )
    assert bad.exit_code == 2
    assert "--image-member" in bad.output
    command = main.commands["export-dataset"]  # type: ignore[attr-defined]
    (param,) = [p for p in command.params if p.name == "image_member"]
    assert set(param.type.choices) == IMAGE_EXTENSIONS  # the flag offers what the option takes
    with pytest.raises(ConfigError, match="image_member must be an image extension"):
        shardex.export("demo:12", tmp_path / "c", image_member="image")
    assert not (tmp_path / "c").exists()


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_sample_with_two_images_is_refused_and_a_mask_is_kept(tmp_path: Path) -> None:
    two = _tar(
        tmp_path / "two" / "a.tar",
        {"a.jpg": image_bytes(1), "b.jpg": image_bytes(2), "b.png": image_bytes(3, "png")},
    )
    with pytest.raises(ConfigError, match=r"sample 'b' has 2 image members"):
        shardex.export(two, tmp_path / "o1", workers=1, image_member="jpg")
    masked = _tar(
        tmp_path / "mask" / "a.tar",
        {"a.webp": image_bytes(1, "webp"), "a.mask.png": image_bytes(2, "png")},
    )
    shardex.export(masked, tmp_path / "o2", workers=1, image_member="jpg")
    (sample,) = shardex.open_dataset(tmp_path / "o2")
    assert sorted(k for k in sample if k != "__key__") == ["jpg", "json", "mask.png"]
    assert sample["mask.png"] == image_bytes(2, "png")


def test_renaming_reads_sliced_chunks_and_null_rows() -> None:
    import pyarrow as pa

    from shardex.image_member import one_image_member
    from shardex.refs.scan import MEMBER_TYPE, MEMBERS

    def member(ext: str) -> dict[str, Any]:
        return {"ext": ext, "path": None, "offset": 0, "size": 1, "data": b"x"}

    rows = [[member("txt")], [member("PNG"), member("cls")], None, [member("webp")], []]
    whole = pa.array(rows, pa.list_(MEMBER_TYPE))
    column = pa.chunked_array([whole.slice(1, 2), whole.slice(3)])  # offsets into shared values
    table = pa.table({"key": ["b", "c", "d", "e"], MEMBERS: column})
    out = one_image_member(table, "jpg")
    assert [None if m is None else [x["ext"] for x in m] for m in out[MEMBERS].to_pylist()] == [
        ["jpg", "cls"],
        None,
        ["jpg"],
        [],
    ]
    assert out["image_format"].to_pylist() == ["png", None, "webp", None]
    assert one_image_member(table, None) is table


def test_overwrite_and_resume_follow_the_option(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for member, want in ((None, set(FORMATS)), ("jpg", {"jpg"}), (None, set(FORMATS))):
        config = shardex.export(
            "demo:30", out, samples_per_shard=8, workers=1, image_member=member, overwrite=True
        )
        assert config.shard_options.get("image_member") == member
        assert {e for s in shardex.open_dataset(out) for e in s if e in FORMATS} == want
        assert shardex.verify(out).ok
        table = pq.read_table(out / str(config.metadata_file))
        assert ("image_format" in table.column_names) == (member is not None)
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    shardex.export("demo:30", clean, samples_per_shard=8, workers=1, image_member="jpg")
    shutil.copytree(clean, resumed)
    (resumed / "config.yaml").unlink()  # as if killed before the commit
    shardex.export(
        "demo:30", resumed, samples_per_shard=8, workers=1, image_member="jpg", mode="resume"
    )
    assert files_of(resumed) == files_of(clean)


def test_an_image_folder_of_mixed_formats_reads_in_hugging_face(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "folder"
    written = {}
    for i in range(9):
        ext = ("png", "jpg", "webp")[i % 3]  # a png first: without the option jpg rows lose
        path = folder / ("cat", "dog")[i % 2] / f"{i:02d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image_bytes(i, ext))
        written[i] = decode(path.read_bytes())
    shardex.export(folder, tmp_path / "out", workers=1, image_member="jpg", samples_per_shard=4)
    tars = _tars(tmp_path / "out")
    rows = list(
        datasets.load_dataset(
            "webdataset", data_files={"train": tars}, split="train", cache_dir=str(tmp_path / "c")
        )
    )
    assert len(rows) == 9
    for row in rows:
        i = int(row["__key__"].rsplit("/", 1)[-1].split(".")[0])
        assert np.array_equal(np.asarray(row["jpg"]), written[i]), row["__key__"]
    assert {r["cls"] for r in rows} == {0, 1}


@pytest.mark.parametrize("member", [None, "jpg", "png"])
def test_re_export_gives_each_image_its_own_format_back(
    exports: tuple[Path, Path], member: str | None, tmp_path: Path
) -> None:
    """Re-exporting an ``image_member`` export reads its images as they were (a png under
    ``.png``): without the option the members are the original mixed ones, with it the
    formats are kept, not all taken for the member name's (and the source's own
    ``image_format`` column is not refused as the user's)."""
    mixed, one = exports
    out = tmp_path / "re"
    config = shardex.export(one, out, samples_per_shard=15, workers=1, image_member=member)
    if member is None:
        assert _images(out) == _images(mixed)
        assert "image_format" not in shardex.open_dataset(out).metadata.column_names
        return
    (spec,) = [s for s in config.key_specs if s.key == "image"]
    assert sorted(spec.encoding.split("|")) == sorted(set(FORMATS.values()))  # type: ignore[union-attr]
    formats = dict(
        zip(
            *shardex.open_dataset(out)
            .metadata.select(["key", "image_format"])
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    assert formats == {k: FORMATS[ext] for k, (ext, _) in _images(mixed).items()}
