"""`shardex verify` finds every kind of damage, names the file and sample, and passes clean
exports; readers fail clearly on the same damage."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import shardex
from shardex.cli import main
from shardex.errors import ChecksumError, FormatError
from shardex.testing import make_sample_folder
from shardex.verification import verify


def _shards(root: Path) -> list[Path]:
    return sorted(root.glob("train/*.tar"))


def _flip_byte(root: Path) -> str:
    """Flip one byte inside the image of sample 10; returns its key."""
    ds = shardex.open_dataset(root)
    key = str(ds[10]["__key__"])
    offset, _sum, shard, length = ds.index.record(10)  # type: ignore[attr-defined]
    path = root / ds.config.splits["train"].shards[shard].path
    data = bytearray(path.read_bytes())
    data[offset + length - 700] ^= 0xFF
    path.write_bytes(bytes(data))
    return key


def _truncate(root: Path) -> str:
    path = _shards(root)[1]
    path.write_bytes(path.read_bytes()[:-3000])
    return ""


def _remove_shard(root: Path) -> str:
    _shards(root)[2].unlink()
    return ""


def _index_past_end(root: Path) -> str:
    path = root / "train" / "index-samples.npy"
    records = np.load(path)
    records["length"][5] += 10_000_000
    np.save(path, records)
    return ""


def _edit_config(root: Path) -> str:
    path = root / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["splits"]["train"]["shards"][0]["num_samples"] = 9
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return ""


DAMAGE: dict[str, tuple[Callable[[Path], str], str]] = {
    "flipped byte": (_flip_byte, "checksum mismatch"),
    "truncated shard": (_truncate, "config.yaml says"),
    "missing shard": (_remove_shard, "missing"),
    "index past the end": (_index_past_end, "past the shard"),
    "edited config": (_edit_config, "num_samples"),
}


def test_clean_export_passes(clean: Path) -> None:
    report = verify(clean, deep=True)
    assert report.ok, report.problems
    assert (report.samples, report.shards) == (30, 4)
    result = CliRunner().invoke(main, ["verify", str(clean), "--deep", "-q"])
    assert result.exit_code == 0
    assert "OK; checked 30 samples in 4 shards" in result.output


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_catches_damage(export: Path, damage: str) -> None:
    make, expected = DAMAGE[damage]
    key = make(export)
    report = verify(export)
    assert not report.ok
    text = "\n".join(str(p) for p in report.problems)
    assert expected in text
    if key:  # the damaged sample is named
        assert any(p.key == key for p in report.problems)
    result = CliRunner().invoke(main, ["verify", str(export), "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.output)
    assert payload["ok"] is False
    assert payload["problems"]


def test_reader_fails_clearly_on_damaged_samples_only(export: Path) -> None:
    key = _flip_byte(export)
    ds = shardex.open_dataset(export)
    with pytest.raises(ChecksumError, match="damaged"):
        ds.get(key)
    assert ds[9]["__key__"] != key  # its neighbours still read
    assert ds[11]["__key__"] != key
    _index_past_end(export)
    ds = shardex.open_dataset(export)
    with pytest.raises(FormatError, match="past the end"):
        ds[5]


def test_deep_verify_catches_an_image_that_does_not_decode(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "src", n=6)
    victim = folder.root / "class0" / "0000.jpg"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # garbled, end marker intact
    data[200:260] = b"\xff" * 60
    victim.write_bytes(bytes(data))
    shardex.export(folder.root, tmp_path / "out", workers=1, validate="none")
    assert verify(tmp_path / "out").ok  # bytes are as exported
    deep = verify(tmp_path / "out", deep=True)
    assert [p.key for p in deep.problems] == ["class0/0000"]


def test_iteration_can_skip_damaged_samples(export: Path) -> None:
    key = _flip_byte(export)
    ds = shardex.open_dataset(export, on_error="skip")
    samples = list(ds)
    assert len(samples) == len(ds) - 1
    assert key not in {s["__key__"] for s in samples}
    assert [(n, "checksum mismatch" in m) for n, m in ds.skipped] == [(10, True)]  # type: ignore[attr-defined]
    with pytest.raises(ChecksumError):
        list(shardex.open_dataset(export))  # the default is to raise
