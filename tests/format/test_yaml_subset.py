"""config.yaml read without PyYAML (shardex.yaml_subset): what it returns is what
``yaml.safe_load`` returns, or it declines and PyYAML reads the text."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from shardex import yaml_subset
from shardex.errors import SchemaError


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (``True == 1`` and ``1.0 == 1`` are not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _agrees(text: str) -> bool:
    """The subset reads ``text`` as PyYAML does, or declines it; True when it read it."""
    try:
        ours = yaml_subset.load(text)
    except yaml_subset.Unsupported:
        return False
    assert _same(ours, yaml.safe_load(text)), text
    return True


_TEXT = st.text(st.characters(codec="ascii"), max_size=12) | st.sampled_from(
    ["yes", "No", "on", "null", "~", "0", "-0", "007", "0x1F", "1_000", "1:20", ".5", "-.5",
     "1.", "1e5", "1.5e+3", ".inf", "-.Inf", ".nan", "2001-12-14", "tar:cls,parquet:label",
     "a: b", "a #b", "- x", "'q'", "it's", "", " x", "x ", "é", "=", "<<", "*a", "&a", "!t"]
)  # fmt: skip
_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=True)
    | _TEXT
)
_DOC = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=1000)
@given(st.dictionaries(_TEXT, _DOC, min_size=1, max_size=5))
def test_what_safe_dump_writes_reads_back_as_pyyaml_reads_it(doc: dict[str, Any]) -> None:
    _agrees(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100))


@settings(max_examples=200, deadline=1000)
@given(st.text(st.characters(codec="ascii"), max_size=20), st.sampled_from(["k: ", "- ", "k:\n- "]))
def test_any_hand_written_value_reads_as_pyyaml_reads_it_or_is_declined(
    value: str, prefix: str
) -> None:
    text = prefix + value + "\n"
    try:
        expected = yaml.safe_load(text)
    except yaml.YAMLError:
        with pytest.raises(yaml_subset.Unsupported):
            yaml_subset.load(text)
        return
    with contextlib.suppress(yaml_subset.Unsupported):
        assert _same(yaml_subset.load(text), expected), text


@pytest.mark.parametrize(
    "text",
    [
        "a:\n  b: 1\n c: 2\n",  # a dedent to no level
        "a: 1\na: 2\n",  # a repeated key (PyYAML keeps the last)
        "a: 1 # note\n",
        "a: b: c\n",
        "- a: b: c\n",
        "a: b:\n",
        "a: x|y #z\n",
        "a: x|y#z\n",
        "a: it's\n",
        "a: -x\n",
        "? a\n: 1\n",
        "a: [1, 2]\n",
        'a: "x"\n',
        "a: &x 1\nb: *x\n",
        "a: 'open\n  quote'\n",
        "a: x\n  y\n",  # a folded plain scalar
        "---\na: 1\n",
        "a:\n\n  b: 1\n",
        "a:\t1\n",
        "a: 1",  # no final newline
        "a: café\n",
        "- a\n- b\n",  # not a mapping: fine by the subset, refused by the schema
    ],
)
def test_text_beyond_the_subset_is_declined_or_read_as_pyyaml_reads_it(text: str) -> None:
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        with pytest.raises(yaml_subset.Unsupported):
            yaml_subset.load(text)
        return
    _agrees(text)


def test_the_config_an_export_writes_is_read_without_pyyaml(tmp_path: Path) -> None:
    shardex.export("demo:12", tmp_path / "o", samples_per_shard=4, workers=1)
    text = (tmp_path / "o" / "config.yaml").read_text()
    assert _agrees(text), "config.yaml as written falls back to PyYAML: opening pays ~10 ms"


def test_a_hand_edited_config_beyond_the_subset_still_opens(tmp_path: Path) -> None:
    shardex.export("demo:12", tmp_path / "o", samples_per_shard=4, workers=1)
    config = tmp_path / "o" / "config.yaml"
    config.write_text("# edited by hand\n" + config.read_text().replace("\n", "  # why\n", 1))
    assert len(shardex.open_dataset(tmp_path / "o", split="train")) == 12
    config.write_text(config.read_text().replace("num_samples: 12", "num_samples: 'twelve'", 1))
    with pytest.raises(SchemaError, match="num_samples"):
        shardex.open_dataset(tmp_path / "o", split="train")


def _nested(depth: int) -> str:
    """A mapping nested ``depth`` levels deep, one key per level."""
    return "".join(" " * i + f"k{i}:\n" for i in range(depth - 1)) + " " * depth + "k: 1\n"


def test_a_deeply_nested_config_is_declined_then_refused_in_one_line(tmp_path: Path) -> None:
    # 600 levels: beyond the subset's recursion, within libyaml's 1000-level limit
    with pytest.raises(yaml_subset.Unsupported):
        yaml_subset.load(_nested(600))
    shardex.export("demo:4", tmp_path / "o", samples_per_shard=4, workers=1)
    (tmp_path / "o" / "config.yaml").write_text(_nested(600))
    with pytest.raises(SchemaError, match=r"config\.yaml") as e:
        shardex.open_dataset(tmp_path / "o", split="train")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["backend: [unclosed\n", _nested(3000), "a: 1\n\tb: 2\n"])
def test_a_config_that_is_not_yaml_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    shardex.export("demo:4", tmp_path / "o", samples_per_shard=4, workers=1)
    (tmp_path / "o" / "config.yaml").write_text(text)
    with pytest.raises(SchemaError, match=r"config\.yaml: not valid YAML \(.*line \d+") as e:
        shardex.open_dataset(tmp_path / "o", split="train")
    assert "\n" not in str(e.value)
