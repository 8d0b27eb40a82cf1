"""A Hugging Face Dataset / DatasetDict as a source (built locally: no hub download)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import shardex
from shardex.cli import main
from shardex.errors import SourceError

datasets = pytest.importorskip("datasets")


def _image(i: int, fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8 + i, 6), (i * 20 % 256, 40, 90)).save(buf, format=fmt)
    return buf.getvalue()


def _dataset(n: int, offset: int = 0) -> Any:
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
            "score": datasets.Value("float32"),
            "embedding": datasets.Sequence(datasets.Value("float32"), length=4),
            "caption": datasets.Value("string"),
        }
    )
    rows = range(offset, offset + n)
    return datasets.Dataset.from_dict(
        {
            "image": [
                {"bytes": _image(i, ("JPEG", "PNG", "WEBP")[i % 3]), "path": None} for i in rows
            ],
            "label": [i % 3 for i in rows],
            "score": [i / 4 for i in rows],
            "embedding": [[i, i + 1, i + 2, i + 3] for i in rows],
            "caption": [f"sample {i}" for i in rows],
        },
        features=features,
    )


def _members(out: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for tar in out.rglob("*.tar"):
        with tarfile.open(tar) as f:
            for m in f.getmembers():
                found[m.name] = f.extractfile(m).read()  # type: ignore[union-attr]
    return found


def _check(out: Path, source: Any) -> None:
    config = shardex.read_config(out)
    assert set(config.splits) == set(source)
    assert config.label_names == ("cat", "dog", "bird")
    members = _members(out)
    for split, ds in source.items():
        raw = ds.cast_column("image", datasets.Image(decode=False))
        opened = shardex.open_dataset(out, split)
        assert len(opened) == len(ds)
        meta = opened.metadata
        assert meta.schema.field("score").type == "float"
        assert str(meta.schema.field("embedding").type) == "fixed_size_list<element: float>[4]"
        for i, sample in enumerate(opened):
            image = next(v for k, v in sample.items() if k in ("jpg", "png", "webp"))
            assert image == raw[i]["image"]["bytes"]  # the original bytes, not re-encoded
            assert int(sample["cls"]) == ds[i]["label"]
            assert meta.column("caption")[i].as_py() == ds[i]["caption"]
            np.testing.assert_array_equal(meta.column("embedding")[i].as_py(), ds[i]["embedding"])
    assert {name.rsplit(".", 1)[1] for name in members} >= {"jpg", "png", "webp", "cls"}


def test_a_dataset_dict_exports_its_splits_labels_and_typed_metadata(tmp_path: Path) -> None:
    source = datasets.DatasetDict({"train": _dataset(7), "test": _dataset(4, offset=7)})
    shardex.export(source, tmp_path / "out", samples_per_shard=3, workers=1)
    _check(tmp_path / "out", source)


def test_a_save_to_disk_folder_is_a_cli_source(tmp_path: Path) -> None:
    source = datasets.DatasetDict({"train": _dataset(5), "validation": _dataset(3, offset=5)})
    source.save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["export-dataset", str(tmp_path / "saved"), "-o", str(out), "-q", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "exported 8 samples" in result.output
    _check(out, source)


def test_a_single_dataset_is_one_split_and_bad_rows_are_refused_or_skipped(
    tmp_path: Path,
) -> None:
    ds = _dataset(4)
    shardex.export(ds, tmp_path / "one", workers=1)
    assert len(shardex.open_dataset(tmp_path / "one")) == 4
    broken = datasets.Dataset.from_dict(
        {
            "image": [
                {"bytes": _image(1, "PNG"), "path": None},
                {"bytes": b"not an image", "path": None},
            ]
        },
        features=datasets.Features({"image": datasets.Image()}),
    )
    with pytest.raises(SourceError, match="not a known image format"):
        shardex.export(broken, tmp_path / "bad", workers=1)
    assert not (tmp_path / "bad" / "config.yaml").exists()
    config = shardex.export(broken, tmp_path / "skip", workers=1, on_error="skip")
    assert config.num_samples == 1
    two = ds.add_column("mask", [None] * 4).cast_column("mask", datasets.Image())
    with pytest.raises(SourceError, match="2 Image columns"):
        shardex.export(two, tmp_path / "two", workers=1)


def test_interop_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    monkeypatch.chdir(tmp_path)
    text = (Path(__file__).resolve().parents[2] / "docs" / "interop.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "hf-saved" in b]
    exec(compile(code, "docs/interop.md", "exec"), {})
    result = CliRunner().invoke(
        main, ["export-dataset", "hf-saved", "-o", "out", "-q", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "exported 8 samples (train 6, test 2)" in result.output


def test_unlabelled_rows_and_batches_cut_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardex.sources.hf as hf

    ds = _dataset(5)
    ds = (
        ds.cast_column("label", datasets.Value("int64"))
        .map(lambda row, i: {"label": -1 if i == 2 else row["label"]}, with_indices=True)
        .cast_column("label", datasets.ClassLabel(names=["cat", "dog", "bird"]))
    )
    # a batch of at most ~2 images' bytes: the source cuts batches, the export is the same
    monkeypatch.setattr(hf, "_BATCH_BYTES", len(_image(4, "PNG")) * 2)
    batches = list(hf.HFSource(ds).stream().batches)
    assert len(batches) > 1
    assert sum(b.table.num_rows for b in batches) == 5
    shardex.export(ds, tmp_path / "o", workers=1)
    labels = shardex.open_dataset(tmp_path / "o").metadata.column("label").to_pylist()
    assert labels == [0, 1, None, 0, 1]


def _export_cli(source: Path, out: Path, *extra: str) -> Any:
    return CliRunner().invoke(
        main, ["export-dataset", str(source), "-o", str(out), "-q", "--workers", "1", *extra]
    )


@pytest.mark.parametrize("on_error", ["error", "skip"])
def test_an_empty_saved_dataset_is_one_line(tmp_path: Path, on_error: str) -> None:
    """datasets saves a Dataset of no rows without a data file and fails to load it
    (IndexError): shardex says the source holds no samples, and a DatasetDict's empty
    split is left out while the others export."""
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])}
    )
    empty = datasets.Dataset.from_dict({"image": [], "label": []}, features=features)
    empty.save_to_disk(str(tmp_path / "empty"))
    result = _export_cli(tmp_path / "empty", tmp_path / "out", "--on-error", on_error)
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: the Hugging Face dataset '{tmp_path / 'empty'}' holds no samples\n"
    )
    assert not (tmp_path / "out" / "config.yaml").exists()
    one = datasets.Dataset.from_dict(
        {"image": [{"bytes": _image(1, "PNG"), "path": None}], "label": [1]}, features=features
    )
    datasets.DatasetDict({"train": one, "test": empty}).save_to_disk(str(tmp_path / "dict"))
    result = _export_cli(tmp_path / "dict", tmp_path / "dict-out", "--on-error", on_error)
    assert result.exit_code == 0, result.output
    assert "exported 1 samples (train 1)" in result.output
    assert list(shardex.read_config(tmp_path / "dict-out").splits) == ["train"]


def test_image_structs_without_features_are_the_images(tmp_path: Path) -> None:
    """Dataset.from_dict without features stores images as {bytes, path} structs: they are
    the images, a nested column beside them stays metadata, and a source whose every row
    is skipped ends in one line."""
    blobs = [_image(i, ("JPEG", "PNG")[i % 2]) for i in range(3)]
    meta = [{"a": [1, 2], "b": {"c": None}}] * 3
    plain = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in blobs], "meta": meta}
    )
    assert not isinstance(plain.features["image"], datasets.Image)  # a struct, as written
    plain.save_to_disk(str(tmp_path / "plain"))
    result = _export_cli(tmp_path / "plain", tmp_path / "out")
    assert result.exit_code == 0, result.output
    opened = shardex.open_dataset(tmp_path / "out")
    assert [next(v for k, v in s.items() if k in ("jpg", "png")) for s in opened] == blobs
    assert opened.metadata.column("meta").to_pylist() == meta
    junk = datasets.Dataset.from_dict(
        {"image": [{"bytes": b"not an image", "path": None}] * 2, "meta": meta[:2]}
    )
    junk.save_to_disk(str(tmp_path / "junk"))
    result = _export_cli(tmp_path / "junk", tmp_path / "junk-out", "--on-error", "skip")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: every sample of {tmp_path / 'junk'} was skipped; nothing to export\n"
    )
    words = datasets.Dataset.from_dict({"caption": ["a", "b"]})
    with pytest.raises(SourceError, match=r"has no Image column \(nor a column of"):
        shardex.export(words, tmp_path / "words", workers=1)


def test_a_key_column_gives_the_keys_and_an_unsafe_one_is_refused_or_skipped(
    tmp_path: Path,
) -> None:
    def saved(name: str, keys: list[str | None]) -> Path:
        datasets.Dataset.from_dict(
            {
                "image": [{"bytes": _image(i, "PNG"), "path": None} for i in range(len(keys))],
                "key": keys,
            },
            features=datasets.Features(
                {"image": datasets.Image(), "key": datasets.Value("string")}
            ),
        ).save_to_disk(str(tmp_path / name))
        return tmp_path / name

    unsafe = saved("unsafe", ["a", "../../evil", "/abs"])
    result = _export_cli(unsafe, tmp_path / "out")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: '{unsafe}[][1]': unsafe key '../../evil' (empty, '.' or '..' path part) "
        "(and 1 more); fix the source or pass --on-error skip\n"
    )
    assert not (tmp_path / "out" / "config.yaml").exists()
    null = saved("null", ["a", "../../evil", "/abs", None])
    result = _export_cli(null, tmp_path / "out", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert f"'{null}[][2]': unsafe key '/abs' (absolute path or backslash)" in result.output
    assert f"'{null}[][3]': the row's key is null" in result.output
    opened = shardex.open_dataset(tmp_path / "out")
    assert list(opened.keys()) == ["a"]
    assert opened.metadata.column("original_path").to_pylist() == [f"{null}[][0]"]
    result = _export_cli(null, tmp_path / "refused")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: '{null}[][3]': the row's key is null; fix the source or pass --on-error skip\n"
    )


def test_columns_named_like_shardex_columns_are_kept_renamed(tmp_path: Path) -> None:
    """An integer ``label`` (what from_dict without features gives) is the label; other
    columns named like one shardex fills are kept as hf_<name>, as tar .json fields are
    kept as json_<name>."""
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": _image(i, "PNG"), "path": None} for i in range(2)],
            "label": [1, 0],
            "split": ["x", "y"],
            "original_path": ["p", "q"],
        }
    )
    shardex.export(ds, tmp_path / "out", workers=1)
    meta = shardex.open_dataset(tmp_path / "out").metadata
    assert meta.column("label").to_pylist() == [1, 0]
    assert meta.column("hf_split").to_pylist() == ["x", "y"]
    assert meta.column("hf_original_path").to_pylist() == ["p", "q"]
    assert meta.column("split").to_pylist() == ["train", "train"]
    both = ds.add_column("hf_split", ["u", "v"])
    with pytest.raises(SourceError, match="column 'split' is reserved by shardex and is kept"):
        shardex.export(both, tmp_path / "both", workers=1)
