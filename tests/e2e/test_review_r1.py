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


def test_an_undone_export_leaves_an_export_inside_its_output_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample refused while writing undoes the run's files, and only the run's: an
    export made meanwhile into a folder inside the output keeps its file being written
    and the files it completed (as the commit leaves them, see test_ray_faults)."""
    import shardex.engine.run as run
    from shardex.errors import BadSampleError
    from shardex.storage.local import LocalObjectWriter

    make_tree(tmp_path / "src", RELS)
    (tmp_path / "src" / "train" / "b" / "zz.jpg").write_bytes(b"not an image")
    out = tmp_path / "out"
    name = "images-0123456789abcdef-000000.tar"
    writers: list[LocalObjectWriter] = []
    plain = run.write_splits

    def meanwhile(*args: object, **kwargs: object) -> object:
        done = out / "nested" / "train" / name.replace("0000.tar", "0001.tar")
        done.parent.mkdir(parents=True)
        done.write_bytes(b"another export's shard, complete")
        nested = LocalObjectWriter(out, f"nested/train/{name}")
        nested.write(b"another export's shard, still being written")
        writers.append(nested)
        return plain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run, "write_splits", meanwhile)
    with pytest.raises(BadSampleError):
        shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    writers[0].commit()  # the nested export's write completes
    nested = out / "nested" / "train"
    assert sorted(p.name for p in nested.iterdir()) == [
        name,
        name.replace("0000.tar", "0001.tar"),
    ]


@pytest.mark.parametrize("backend", ["numpy", "numpy_mmap", "tensor_shards"])
def test_other_backends_on_ray_equal_local(cluster: None, tmp_path: Path, backend: str) -> None:
    make_tree(tmp_path / "src", RELS)
    outs = {}
    for name, kw in (("ray", {"executor": "ray"}), ("local", {"workers": 1})):
        out = tmp_path / name
        shardex.export(tmp_path / "src", out, backend=backend, samples_per_shard=4, **kw)
        outs[name] = files_of(out)
    assert outs["ray"] == outs["local"]
    assert not (tmp_path / "ray" / ".shardex-staging").exists()
