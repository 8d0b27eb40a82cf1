"""Scenarios: a bare SOURCE name is a spec file NAME.yaml / NAME.yml in the current folder,
then in SHARDEX_SCENARIO_PATH, for `export-dataset` (with and without --preprocess) and
`pipeline run`, as NexuML's documented commands spell them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

import shardex
from tests.support.s3data import S3Location

#: The scenario: the demo in two splits, then stages that decode, embed and resize.
_SCENARIO = {
    "source": "demo:12",
    "options": {"split_fractions": {"train": 0.5, "val": 0.5}, "seed": 0, "samples_per_shard": 4},
    "stages": [
        {"stage": "decode"},
        {
            "stage": "embed",
            "model": "shardex.testing.models:tiny_embedder",
            "key": "clip",
            "input_size": 32,
        },
        {"stage": "resize", "size": 16},
    ],
}


def _shardex(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "SHARDEX_SCENARIO_PATH"}
    environment = {**inherited, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "shardex.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
    )


def _write(folder: Path, name: str, spec: dict[str, object] = _SCENARIO) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_scenario_name_in_the_current_folder_exports_its_source(tmp_path: Path) -> None:
    _write(tmp_path, "my-scenario.yaml")
    done = _shardex(
        tmp_path,
        *("export-dataset", "my-scenario", "-o", "exported-data", "--backend", "numpy"),
        *("--split", "train", "--split", "val", "-q"),
    )
    assert done.returncode == 0, done.stderr
    config = shardex.read_config(tmp_path / "exported-data")
    assert config.backend == "numpy"
    counts = {name: split.num_samples for name, split in config.splits.items()}
    assert sorted(counts) == ["train", "val"] and sum(counts.values()) == 12
    assert [p["stage"] for p in config.pipeline] == ["read"]  # no --preprocess: no stages
    sample = shardex.open_dataset(tmp_path / "exported-data", "val", decode=True)[0]
    assert sample["jpg"].dtype == np.uint8 and sample["jpg"].ndim == 3


def test_preprocess_until_key_of_a_scenario_on_the_path_stores_that_key(
    tmp_path: Path, s3: S3Location
) -> None:
    """`--preprocess --preprocess-until-key clip` runs decode and embed (not resize) and
    stores `clip` as a feature without --x-key; the scenario is found through
    SHARDEX_SCENARIO_PATH (a .yml in its second folder), the output is on S3."""
    _write(tmp_path / "scenarios", "my-scenario.yml")
    work = tmp_path / "work"
    work.mkdir()
    path = os.pathsep.join([str(tmp_path / "empty"), str(tmp_path / "scenarios")])
    out = s3.child("prepared-data")
    done = _shardex(
        work,
        *("export-dataset", "my-scenario", "-o", out, "--backend", "tensor_shards"),
        *("--preprocess", "--preprocess-until-key", "clip", "-q"),
        *("--s3-endpoint-url", s3.direct["endpoint_url"], "--s3-region", s3.server.region),
        env={
            "SHARDEX_SCENARIO_PATH": path,
            "AWS_ACCESS_KEY_ID": s3.direct["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": s3.direct["secret_access_key"],
        },
    )
    assert done.returncode == 0, done.stderr
    config = shardex.read_config(out, s3.direct)
    assert [p["stage"] for p in config.pipeline] == ["read", "decode", "embed"]
    assert "clip" in config.x_keys
    assert config.num_samples == 12
    ds = shardex.open_dataset(out, "train", decode=True, storage_options=s3.direct)
    clip = ds[0]["clip.npy"]
    assert clip.dtype == np.float32 and clip.shape == (8,)


def test_the_current_folder_comes_before_the_path_and_pipeline_run_takes_names(
    tmp_path: Path,
) -> None:
    here = {**_SCENARIO, "options": {"samples_per_shard": 5}}
    _write(tmp_path, "s.yaml", here)
    _write(tmp_path / "elsewhere", "s.yaml", {**_SCENARIO, "source": "demo:3"})
    done = _shardex(
        tmp_path,
        *("pipeline", "run", "s", "-o", "out", "-q"),
        env={"SHARDEX_SCENARIO_PATH": str(tmp_path / "elsewhere")},
    )
    assert done.returncode == 0, done.stderr
    config = shardex.read_config(tmp_path / "out")
    assert config.num_samples == 12  # the current folder's demo:12, not demo:3
    assert [p["stage"] for p in config.pipeline] == ["read", "decode", "embed", "resize"]


def test_an_unknown_scenario_is_one_line_naming_where_it_looked(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    for flags in ([], ["--preprocess"]):
        done = _shardex(
            tmp_path,
            *("export-dataset", "nope", "-o", "out", *flags),
            env={"SHARDEX_SCENARIO_PATH": str(elsewhere)},
        )
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("error: source 'nope'"), lines[0]
        assert "nope.yaml or nope.yml" in lines[0]
        assert str(tmp_path) in lines[0] and str(elsewhere) in lines[0]
    assert not (tmp_path / "out").exists()
