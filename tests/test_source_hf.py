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
    text = (Path(__file__).resolve().parents[1] / "docs" / "interop.md").read_text()
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
