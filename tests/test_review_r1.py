"""Ray exports equal local ones where the branches meet (append, flat, skip), and a killed
Ray run's staged parts do not outlive the next export, whatever runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shardex
from helpers import files_of, make_tree
from tests.support.raycluster import ray_nodes

RELS = [
    f"{split}/{cls}/img{i:02d}.jpg"
    for split in ("train", "val")
    for cls in ("a", "b")
    for i in range(5)
]
MORE = [
    f"{split}/{cls}/new{i:02d}.jpg"
    for split in ("train", "val")
    for cls in ("a", "b")
    for i in range(3)
]
PART = ".shardex-staging/0123456789ab/part-0123456789abcdef.npz"


def _killed_runs_part(out: Path) -> Path:
    part = out / PART
    part.parent.mkdir(parents=True)
    part.write_bytes(b"a part a killed Ray run staged")
    return part


def test_a_killed_ray_runs_parts_go_with_a_local_export(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", RELS)
    out = tmp_path / "out"
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    part = _killed_runs_part(out)
    shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1, mode="overwrite")
    assert not part.exists()
    assert not (out / ".shardex-staging").exists()


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    with ray_nodes(nodes=1, cpus_per_node=2):
        yield


def test_append_flat_and_skip_on_ray_equal_local(cluster: None, tmp_path: Path) -> None:
    make_tree(tmp_path / "src", RELS)
    make_tree(tmp_path / "more", MORE, first_seed=100)
    (tmp_path / "more" / "train" / "a" / "bad.jpg").write_bytes(b"not an image")
    outs = {}
    for name, kw in (("ray", {"executor": "ray"}), ("local", {"workers": 2})):
        out = tmp_path / name
        shardex.export(tmp_path / "src", out, samples_per_shard=4, seed=3, **kw)
        shardex.export(
            tmp_path / "more",
            out,
            samples_per_shard=4,
            seed=3,
            mode="append",
            on_error="skip",
            **kw,
        )
        outs[name] = files_of(out)
    assert outs["ray"] == outs["local"]
    flat = {}
    for name, kw in (("ray", {"executor": "ray"}), ("local", {"workers": 2})):
        out = tmp_path / f"flat-{name}"
        shardex.export(tmp_path / "src" / "train", out, samples_per_shard=4, layout="flat", **kw)
        flat[name] = files_of(out)
    assert flat["ray"] == flat["local"]
