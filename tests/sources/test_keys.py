"""Sample keys. Duplicate and unsafe keys are found through hashes of the case-folded
keys; the result is the same as comparing every key with every earlier one. A table of
image paths without a key column gets the keys a folder source would give."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import make_tree
from shardex.checks import unsafe_key, unsafe_keys
from shardex.engine.stream import scan_stream
from shardex.errors import EmptySourceError
from shardex.options import ExportOptions
from shardex.refs.scan import SampleStream, ScanBatch, build_table


def _reference(keys: list[str], taken: frozenset[str]) -> list[str | None]:
    """The plain rule: the first of equal keys (or of keys equal but for case) is kept."""
    out: list[str | None] = []
    kept: list[tuple[int, str]] = []
    for i, key in enumerate(keys):
        reason = unsafe_key(key)
        if reason is None and key in taken:
            reason = "taken"
        elif reason is None and any(k == key for _, k in kept):
            reason = "same"
        elif reason is None and any(k.casefold() == key.casefold() for _, k in kept):
            reason = "case"
        if reason is None:
            kept.append((i, key))
        out.append(reason)
    return out


def _kind(reason: str | None) -> str | None:
    if reason is None:
        return None
    if "already in the export" in reason:
        return "taken"
    if "also used by" in reason:
        return "same"
    if "differs only by case" in reason:
        return "case"
    return reason


def _reasons(
    keys: list[str], taken: frozenset[str] = frozenset(), batch: int = 7
) -> list[str | None] | None:
    """Why pass 1 drops each key (None: kept), the keys given in batches of ``batch``;
    None when it drops them all (the export refuses)."""
    rows = [[{"ext": "bin", "path": None, "offset": -1, "size": 1, "data": b"x"}]] * len(keys)
    table = build_table(keys, [f"src/{i}" for i in range(len(keys))], rows)
    starts = range(0, max(len(keys), 1), batch)
    stream = SampleStream(iter([ScanBatch(table.slice(a, batch)) for a in starts]))
    with tempfile.TemporaryDirectory() as folder:
        try:
            scanned = scan_stream(stream, ExportOptions(on_error="skip"), Path(folder), "k", taken)
        except EmptySourceError:
            return None
    reasons: list[str | None] = [None] * len(keys)
    for record in scanned.skipped:
        reasons[int(record["original_path"].removeprefix("src/"))] = record["reason"]
    return reasons


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="aAbB/.ẞß", max_size=4), max_size=30),
    st.frozensets(st.text(alphabet="aAb", max_size=2), max_size=3),
)
def test_key_checks_match_comparing_every_pair(keys: list[str], taken: frozenset[str]) -> None:
    """Pass 1 checks keys batch by batch and finds repeats from hashes across batches:
    the result is the plain rule's."""
    reasons, expected = _reasons(keys, taken), _reference(keys, taken)
    if reasons is None:
        assert all(r is not None for r in expected)
    else:
        assert [_kind(r) for r in reasons] == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(alphabet="a/.\\\x00\x1f\x7f\n ß", max_size=6))))
def test_keys_checked_all_at_once_are_refused_as_one_by_one(keys: list[str | None]) -> None:
    expected = [unsafe_key(k) is not None for k in keys]  # type: ignore[arg-type]
    for column in (pa.array(keys, pa.string()), pa.chunked_array([keys], pa.large_string())):
        assert unsafe_keys(column).tolist() == expected


def test_a_duplicate_names_the_first_sample_with_its_key() -> None:
    reasons = _reasons(["cat/1", "dog/1", "Cat/1", "cat/1"], batch=2)
    assert reasons is not None
    assert reasons[:2] == [None, None]
    assert reasons[2] == "duplicate key 'Cat/1': differs only by case from 'cat/1'"
    assert reasons[3] == "duplicate key 'cat/1' (also used by 'src/0')"


def test_absolute_paths_without_a_key_column_get_keys_from_their_common_parent(
    tmp_path: Path,
) -> None:
    written = make_tree(tmp_path / "data", ["cats/a.jpg", "dogs/b.png", "dogs/c.v2.jpg"])
    paths = [str(tmp_path / "data" / rel) for rel in sorted(written)]
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image_path": paths}), table)
    shardex.export(table, tmp_path / "out", workers=1)
    keys = {"cats/a", "dogs/b", "dogs/c_v2"}  # as a folder source names them
    ds = shardex.open_dataset(tmp_path / "out")
    assert set(ds.keys()) == keys  # type: ignore[attr-defined]
    assert ds.get("dogs/b")["png"] == written["dogs/b.png"]
    # the same table gives the same keys; "../" paths are resolved the same way
    shardex.export(table, tmp_path / "again", workers=1)
    assert set(shardex.open_dataset(tmp_path / "again").keys()) == keys  # type: ignore[attr-defined]
    (tmp_path / "lists").mkdir()
    rels = [f"../data/{rel}" for rel in sorted(written)]
    pq.write_table(pa.table({"path": rels}), tmp_path / "lists" / "t.parquet")
    shardex.export(tmp_path / "lists" / "t.parquet", tmp_path / "rel", workers=1)
    assert set(shardex.open_dataset(tmp_path / "rel").keys()) == keys  # type: ignore[attr-defined]
