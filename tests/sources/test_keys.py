"""Sample keys. Duplicate and unsafe keys are found through hashes of the case-folded
keys; the result is the same as comparing every key with every earlier one. A table of
image paths without a key column gets the keys a folder source would give."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import make_tree
from shardex.checks import _all_safe, _check_keys, unsafe_key


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


@settings(max_examples=200, deadline=2000)
@given(
    st.lists(st.text(alphabet="aAbB/.ẞß", max_size=4), max_size=30),
    st.frozensets(st.text(alphabet="aAb", max_size=2), max_size=3),
)
def test_key_checks_match_comparing_every_pair(keys: list[str], taken: frozenset[str]) -> None:
    reasons: list[str | None] = [None] * len(keys)
    originals = pa.chunked_array([[f"src/{i}" for i in range(len(keys))]], pa.string())
    _check_keys(keys, reasons, originals, taken)
    assert [_kind(r) for r in reasons] == _reference(keys, taken)


def test_a_duplicate_names_the_first_sample_with_its_key() -> None:
    keys = ["cat/1", "dog/1", "Cat/1", "cat/1"]
    reasons: list[str | None] = [None] * 4
    _check_keys(keys, reasons, pa.chunked_array([["a.jpg", "b.jpg", "c.jpg", "d.jpg"]]))
    assert reasons[:2] == [None, None]
    assert reasons[2] == "duplicate key 'Cat/1': differs only by case from 'cat/1'"
    assert reasons[3] == "duplicate key 'cat/1' (also used by 'a.jpg')"


@settings(max_examples=300, deadline=2000)
@given(st.lists(st.text(alphabet="a/.\n\r\x00\x0b\x1f\x7f\\", max_size=5), max_size=8))
def test_one_search_over_all_keys_finds_what_each_key_alone_gives(keys: list[str]) -> None:
    # the export checks all keys with one regex pass (newlines join them); it must call
    # them all safe exactly when each one alone is
    assert _all_safe(keys, frozenset()) == all(unsafe_key(k) is None for k in keys)


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
