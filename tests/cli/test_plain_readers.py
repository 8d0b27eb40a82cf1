"""``shardex inspect`` prints, per split, the call that opens it with the stock library;
each call runs as printed in a process that never imports shardex."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardex
from shardex.cli import main
from shardex.testing.data import make_image

LABELS = [3, 1, 4, 1, 5, 9, 2]
IMAGES = np.arange(7 * 4 * 4 * 3, dtype=np.uint8).reshape(7, 4, 4, 3)

# What each library's object must give: the labels, as a user reads them. A call over
# many files is a function of the names in its comment (``  # SHARD: ...; COLUMN: ...``),
# in that order; ``SHARDS`` and ``COUNTS`` are the split's shard numbers and sizes.
CHECKS = {
    "zarr": "labels = obj['label__label'][:]",
    "numpy_mmap": "labels = obj('label__label')[:]",
    "tensordict_memmap": "labels = obj['label__label'].numpy()",
    "torch": "labels = [v for s in SHARDS for v in obj(s)['label__label'].tolist()]",
    "tensor_shards": "labels = [v for s in SHARDS for v in obj(s)['label__label']]",
    "numpy": (
        "labels = [obj(s, f'{i:06d}', 'label__label') "
        "for s, n in zip(SHARDS, COUNTS) for i in range(n)]"
    ),
}

SCRIPT = """
import sys
import numpy, torch, zarr, tensordict
{call}
assert "shardex" not in sys.modules
{check}
print(",".join(str(int(v)) for v in labels))
"""


def _calls(out: Path) -> dict[str, str]:
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.output.split("without shardex:\n", 1)[1].splitlines()
    return dict(line.strip().split(": ", 1) for line in lines)


def _function(call: str) -> tuple[str, dict[str, str]]:
    """``obj = ...`` for a printed call, and the values its comment gives each name."""
    expr, _, comment = call.partition("  # ")
    names = dict(part.split(": ", 1) for part in comment.split("; ")) if comment else {}
    return f"obj = lambda {', '.join(names)}: {expr}" if names else f"obj = {expr}", names


def _run(code: str, cwd: Path, warnings: str = "error") -> str:
    done = subprocess.run(
        [sys.executable, "-W", warnings, "-c", code], capture_output=True, text=True, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("backend", sorted(CHECKS))
def test_inspect_prints_a_call_that_opens_the_split(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = shardex.export(
        {"image": IMAGES, "label": LABELS}, out, backend=backend, samples_per_shard=3, workers=1
    )
    code, names = _function(_calls(out)["train"])
    shards = config.split("train").shards
    if "SHARD" in names:  # one file per shard: the comment gives their numbers
        assert len(shards) == 3
        assert names["SHARD"] == "000000 to 000002"
    if "COLUMN" in names:
        assert "label__label" in names["COLUMN"].split(", ")
    numbers = [f"{k:06d}" for k in range(len(shards))]
    code += f"\nSHARDS, COUNTS = {numbers!r}, {[s.num_samples for s in shards]!r}"
    want = shardex.open_dataset(out, split="train").metadata.column("label").to_pylist()
    printed = _run(SCRIPT.format(call=code, check=CHECKS[backend]), tmp_path)
    assert printed.strip() == ",".join(map(str, want))
    assert sorted(want) == sorted(LABELS)


def test_inspect_prints_wids_calls_for_each_split(tmp_path: Path) -> None:
    pytest.importorskip("wids")
    out = tmp_path / "out"
    blobs = [make_image(i) for i in range(20)]
    fractions = {"train": 0.5, "val": 0.5}
    config = shardex.export({"jpg": blobs}, out, split_fractions=fractions, workers=1)
    calls = _calls(out)
    assert set(calls) == {"train", "val"}
    for split, call in calls.items():
        code = textwrap.dedent(
            f"""
            import sys, wids
            ds = {call}
            assert "shardex" not in sys.modules
            print(len(ds))
            """
        )
        # (wids warns that its own default, transformations="PIL", is deprecated)
        assert int(_run(code, tmp_path, warnings="default")) == config.split(split).num_samples


def test_a_path_wids_cannot_take_gets_no_wids_call(tmp_path: Path) -> None:
    """wids reads its argument as a URL ("#" starts a fragment): for such a folder no call
    is printed rather than one that fails; zarr's, which takes the path as it is, runs."""
    pytest.importorskip("wids")
    out = tmp_path / "run #2?"
    shardex.export({"jpg": [make_image(i) for i in range(4)]}, out, workers=1)
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert result.exit_code == 0, result.output
    assert "wids.ShardListDataset" not in result.output
    zarr_out = tmp_path / "zarr #2?"
    shardex.export({"image": IMAGES, "label": LABELS}, zarr_out, backend="zarr", workers=1)
    code, _ = _function(_calls(zarr_out)["train"])
    printed = _run(SCRIPT.format(call=code, check=CHECKS["zarr"]), tmp_path)
    assert sorted(map(int, printed.strip().split(","))) == sorted(LABELS)


def test_member_names_past_100_bytes_get_a_webdataset_call(tmp_path: Path) -> None:
    """wids reads ustar's 100-byte name field alone (no GNU long name, no prefix): a
    split with a longer member name gets webdataset's call instead, which reads every
    sample under its whole key."""
    pytest.importorskip("webdataset")
    src = tmp_path / "src" / "cat"
    src.mkdir(parents=True)
    long = "x" * 120  # past 100 bytes with its extension: a GNU long-name record
    for name, i in ((long, 1), ("y" * 60 + "/" + "z" * 60, 2), ("short", 3)):
        (src / f"{name}.jpg").parent.mkdir(parents=True, exist_ok=True)
        (src / f"{name}.jpg").write_bytes(make_image(i))
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, workers=1)
    call = _calls(out)["train"]
    assert call.startswith("webdataset.WebDataset(")
    code = textwrap.dedent(
        f"""
        import sys, webdataset
        ds = {call}
        assert "shardex" not in sys.modules
        print("\\n".join(sorted(s["__key__"] for s in ds)))
        """
    )
    keys = _run(code, tmp_path, warnings="default").split()
    assert keys == sorted(shardex.open_dataset(out).keys())
    assert f"cat/{long}" in keys and "cat/short" in keys
