"""``--dtype bfloat16`` (issue 18, item 2) and a ``predict`` split like any other.

bfloat16 is stored by the backends that can hold it (torch, tensordict_memmap,
tensor_shards) and read back equal to ``torch.tensor(x, dtype=torch.bfloat16)`` of the
original, by shardex and by torch / tensordict / numpy themselves; the other backends
refuse it in one line before anything is read or written.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import shardex
from shardex.cli import main
from shardex.errors import ConfigError
from shardex.pipeline import ImageWriterStage
from tests.helpers import write_image

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")

BFLOAT16_BACKENDS = ("torch", "tensor_shards", "tensordict_memmap")
OTHER_BACKENDS = ("webdataset", "numpy", "numpy_mmap", "zarr")
N = 9
# values where a cast is visible: rounding ties, a subnormal, overflow to inf, -0.0
SPECIAL = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1e-40, 3.39e38, -0.0, -np.inf, 65504.0, 1 / 3])


def _data() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((N, 8)).astype(np.float32) * 100
    dense[0] = SPECIAL.astype(np.float32)
    return {
        "key": [f"s{i}" for i in range(N)],
        "emb": dense,  # float32, fixed
        "wide": rng.standard_normal((N, 2, 3)) * 1e5,  # float64, fixed
        "ragged": [rng.random(i + 1).astype(np.float32) for i in range(N)],
        "count": np.arange(N, dtype=np.int32),  # never cast
    }


def _bf16(x: Any) -> Any:
    return torch.tensor(x, dtype=torch.bfloat16)


def _same(got: Any, want: Any) -> None:
    """Bit for bit (torch.equal would also accept +0.0 for -0.0)."""
    assert got.dtype == torch.bfloat16
    assert got.shape == want.shape
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _plain(out: Path, backend: str) -> dict[str, Any]:
    """Sample key -> {"emb": tensor, "wide": tensor}, read without shardex."""
    config = yaml.safe_load((out / "config.yaml").read_text())
    got: dict[str, Any] = {}
    for shard in config["splits"]["train"]["shards"]:
        path = out / shard["path"]
        if backend == "torch":
            columns = torch.load(path, weights_only=True)
        elif backend == "tensordict_memmap":
            td = tensordict.TensorDict.load_memmap(path)
            columns = {
                "__key__.data": td["__key__", "data"],
                "__key__.offsets": td["__key__", "offsets"],
                "emb": td["emb"],
                "wide": td["wide"],
            }
        else:  # .npz of bit patterns: config.yaml's fields say bfloat16
            with np.load(path) as npz:
                columns = {
                    name: torch.from_numpy(npz[name].view(np.int16)).view(torch.bfloat16)
                    if name in ("emb", "wide")
                    else torch.from_numpy(npz[name])
                    for name in npz.files
                }
        offsets = columns["__key__.offsets"].tolist()
        data = columns["__key__.data"].numpy().tobytes()
        for i in range(len(offsets) - 1):
            key = data[offsets[i] : offsets[i + 1]].decode()
            got[key] = {"emb": columns["emb"][i], "wide": columns["wide"][i]}
    return got


@pytest.mark.parametrize("backend", BFLOAT16_BACKENDS)
def test_bfloat16_reads_back_as_torch_casts_it(tmp_path: Path, backend: str) -> None:
    data = _data()
    out = tmp_path / "out"
    config = shardex.export(data, out, backend=backend, dtype="bfloat16", samples_per_shard=4)
    dtypes = {f.name: f.dtype for f in config.fields}
    assert dtypes == {
        "emb.npy": "bfloat16",
        "wide.npy": "bfloat16",
        "ragged.npy": "bfloat16",
        "count.npy": "int32",
    }
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["shard_options"]["dtype"] == "bfloat16"
    assert {s["key"]: s["dtype"] for s in written["key_specs"]}["emb"] == "bfloat16"
    ds = shardex.open_dataset(out, decode=True)
    raw = shardex.open_dataset(out)
    for i in range(N):
        sample = ds[i]
        index = int(sample["__key__"][1:])
        for name in ("emb", "wide", "ragged"):
            _same(sample[f"{name}.npy"], _bf16(data[name][index]))
        assert sample["count.npy"] == index
        assert sample["count.npy"].dtype == np.int32
        # raw samples are .npy bytes: float32 holding exactly the bfloat16 values
        npy = np.load(io.BytesIO(raw[i]["emb.npy"]), allow_pickle=False)
        assert npy.dtype == np.float32
        assert torch.equal(torch.from_numpy(npy), _bf16(data["emb"][index]).float())
    for key, columns in _plain(out, backend).items():
        index = int(key[1:])
        _same(columns["emb"], _bf16(data["emb"][index]))
        _same(columns["wide"], _bf16(data["wide"][index]))
    report = shardex.verify(out)
    assert report.ok, report.problems


@pytest.mark.parametrize("backend", ["torch", "tensor_shards"])
def test_window_loader_batches_bfloat16(tmp_path: Path, backend: str) -> None:
    from shardex.torch import TensorShardsLoader

    data = _data()
    out = tmp_path / "out"
    shardex.export(data, out, backend=backend, dtype="bfloat16", samples_per_shard=4)
    loader = TensorShardsLoader(out, batch_size=3, shuffle_shards=False, shuffle_samples=False)
    seen = 0
    for batch in loader:
        assert batch["emb.npy"].dtype == torch.bfloat16
        for row, key in enumerate(batch["__key__"]):
            index = int(key[1:])
            _same(batch["emb.npy"][row], _bf16(data["emb"][index]))
            seen += 1
    assert seen == N


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _tar(path: Path, arrays: list[np.ndarray]) -> None:
    with tarfile.open(path, "w") as tf:
        for i, array in enumerate(arrays):
            for name, data in ((f"{i:04d}.x.npy", _npy(array)), (f"{i:04d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_cli_dtype_bfloat16(tmp_path: Path) -> None:
    arrays = [np.random.default_rng(i).standard_normal(16) for i in range(5)]
    _tar(tmp_path / "src.tar", arrays)
    out = tmp_path / "out"
    args = ["export-dataset", str(tmp_path / "src.tar"), "-o", str(out), "--backend", "torch"]
    result = CliRunner().invoke(main, [*args, "--dtype", "bfloat16", "-q"])
    assert result.exit_code == 0, result.output
    ds = shardex.open_dataset(out, decode=True)
    for sample in ds:
        _same(sample["x.npy"], _bf16(arrays[int(sample["__key__"])]))
    assert "bfloat16" in CliRunner().invoke(main, ["export-dataset", "--help"]).output


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_other_backends_refuse_bfloat16_before_any_work(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    # the source does not even exist: the refusal comes before it is looked at
    args = ["export-dataset", str(tmp_path / "missing.tar"), "-o", str(out), "-q"]
    result = CliRunner().invoke(main, [*args, "--backend", backend, "--dtype", "bfloat16"])
    assert result.exit_code == 1
    line = result.output.strip()
    assert "\n" not in line
    assert line == (
        f"error: the {backend} backend cannot store dtype bfloat16; use one that can "
        "(tensor_shards, tensordict_memmap, torch) or another dtype"
    )
    assert not out.exists()
    with pytest.raises(ConfigError, match="cannot store dtype bfloat16"):
        shardex.export(_data(), out, backend=backend, dtype="bfloat16")
    assert not out.exists()
    with pytest.raises(ConfigError, match="cannot store dtype bfloat16"):
        ImageWriterStage(out, backend=backend, dtype="bfloat16")  # at construction


# ---------------------------------------------------------------- the predict split


def test_predict_split_from_a_folder_cli_and_api(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i in range(3):
        write_image(src / "train" / "cat" / f"{i}.png", i)
        write_image(src / "train" / "dog" / f"{i}.png", 10 + i)
        write_image(src / "predict" / f"p{i}.png", 20 + i)  # unlabelled, as predict sets are
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["export-dataset", str(src), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert "predict 3" in result.output
    config = shardex.read_config(out)
    assert sorted(config.splits) == ["predict", "train"]
    assert config.label_names == ("cat", "dog")
    ds = shardex.open_dataset(out, split="predict")
    assert sorted(s["__key__"] for s in ds) == ["predict/p0", "predict/p1", "predict/p2"]
    assert all("cls" not in s for s in ds)
    inspect = CliRunner().invoke(main, ["inspect", str(out)])
    assert inspect.exit_code == 0
    assert "predict" in inspect.output


@pytest.mark.parametrize("backend", ["webdataset", "torch"])
def test_predict_split_by_fractions_and_selected(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    args = ["export-dataset", "demo:30", "-o", str(out), "--backend", backend, "-q"]
    fractions = ["--split-fractions", "train=0.5,predict=0.5"]
    result = CliRunner().invoke(main, [*args, *fractions])
    assert result.exit_code == 0, result.output
    config = shardex.read_config(out)
    assert set(config.splits) == {"train", "predict"}
    predict = shardex.open_dataset(out, split="predict")
    assert len(predict) == config.splits["predict"].num_samples > 0
    only = tmp_path / "only"
    result = CliRunner().invoke(
        main, [*args[:3], str(only), *args[4:], *fractions, "--split", "predict"]
    )
    assert result.exit_code == 0, result.output
    assert list(shardex.read_config(only).splits) == ["predict"]
    ds = shardex.ExportedDataset(only)  # the only split
    assert len(ds) == len(predict)
    assert sorted(s["__key__"] for s in shardex.open_dataset(only)) == sorted(
        s["__key__"] for s in predict
    )
