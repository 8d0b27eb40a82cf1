"""The ``shardex`` command line, driven in-process with click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

import shardex
from helpers import error_line, make_tree
from shardex.cli import main


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _ok(*args: str) -> Result:
    result = _cli(*args)
    assert result.exit_code == 0, f"shardex {' '.join(args)} failed:\n{result.output}"
    return result


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    """A small class folder: 2 classes x 5 JPEGs, plus 2 PNGs."""
    root = tmp_path_factory.mktemp("cli-src")
    rels = [f"{c}/{c}{i}.jpg" for c in ("cat", "dog") for i in range(5)]
    written = make_tree(root, [*rels, "dog/extra0.png", "cat/extra1.png"])
    return root, written


@pytest.fixture(scope="module")
def exported(
    src: tuple[Path, dict[str, bytes]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Result]:
    out = tmp_path_factory.mktemp("cli-out") / "export"
    result = _ok(
        "export-dataset", str(src[0]), "-o", str(out), "--samples-per-shard", "5", "--workers", "1"
    )
    return out, result


# ---------------------------------------------------------------- help


def test_main_help_lists_every_command() -> None:
    result = _ok("--help")
    for command in ("export-dataset", "inspect", "ls", "get", "backend"):
        assert command in result.output
    assert "Usage:" in result.output
    assert _ok("-h").output == result.output


def test_version() -> None:
    assert shardex.__version__ in _ok("--version").output


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (
            ["export-dataset"],
            [
                "--output",
                "--backend",
                "--split",
                "--x-key",
                "--y-key",
                "--labels",
                "--samples-per-shard",
                "--max-shard-bytes",
                "--split-fractions",
                "--seed",
                "--workers",
                "--overwrite",
                "--on-error",
                "--validate",
                "--quiet",
            ],
        ),
        (["inspect"], ["--json"]),
        (["ls"], ["--split", "--limit", "--no-header"]),
        (["get"], ["--split", "--out", "--field"]),
        (["backend"], ["list"]),
        (["backend", "list"], ["data-export"]),
    ],
    ids=["export-dataset", "inspect", "ls", "get", "backend", "backend-list"],
)
def test_command_help_mentions_its_options(command: list[str], options: list[str]) -> None:
    result = _ok(*command, "--help")
    assert "Usage:" in result.output
    for option in options:
        assert option in result.output, f"{option} missing from `{' '.join(command)} --help`"


# ---------------------------------------------------------------- export, inspect, ls, get


def test_export_dataset_reports_what_it_wrote(
    exported: tuple[Path, Result], src: tuple[Path, dict[str, bytes]]
) -> None:
    out, result = exported
    assert "exported 12 samples" in result.stdout
    assert "train 12" in result.stdout
    assert "3 shards" in result.stdout  # 5 + 5 + 2
    assert (out / "config.yaml").is_file()
    ds = shardex.open_dataset(out)
    assert len(ds) == 12
    written = src[1]
    for rel, data in written.items():
        sample = ds.get(rel.rsplit(".", 1)[0])
        assert sample[rel.rsplit(".", 1)[1]] == data


def test_inspect_summarises_the_export(exported: tuple[Path, Result]) -> None:
    out, _ = exported
    text = " ".join(_ok("inspect", str(out)).output.split())  # rich wraps long lines
    assert "12 samples" in text
    assert "webdataset" in text
    assert "train" in text
    assert "labels (2): cat, dog" in text
    for key in ("image", "label"):
        assert key in text


def test_inspect_json_is_the_config(exported: tuple[Path, Result]) -> None:
    out, _ = exported
    as_json = json.loads(_ok("inspect", str(out), "--json").output)
    assert as_json == yaml.safe_load((out / "config.yaml").read_text())


LS_HEADER = "split\tkey\tshard\toffset\tlength\toriginal_path"


def test_ls_with_limit(exported: tuple[Path, Result]) -> None:
    out, _ = exported
    header, *lines = _ok("ls", str(out), "--limit", "3").output.splitlines()
    assert header == LS_HEADER
    assert len(lines) == 3
    meta = shardex.open_dataset(out).metadata.to_pylist()
    for line, row in zip(lines, meta, strict=False):
        split, key, tar, offset, length, original = line.split("\t")
        assert (split, key, original) == ("train", row["key"], row["original_path"])
        assert tar == row["tar_file"]
        assert (int(offset), int(length)) == (row["sample_offset"], row["sample_length"])
    everything = _ok("ls", str(out), "--no-header").output.splitlines()
    assert everything[:3] == lines
    assert len(everything) == 12
    assert _ok("ls", str(out), "--limit", "0").output == LS_HEADER + "\n"
    assert _ok("ls", str(out), "--limit", "0", "--no-header").output == ""


def test_ls_names_its_columns_in_one_order_in_output_help_and_readme() -> None:
    """The header, --help and the README's quick start name the same columns in order."""
    names = LS_HEADER.split("\t")
    assert ", ".join(names) in " ".join(_ok("ls", "--help").output.split())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (line,) = [x for x in readme.splitlines() if x.startswith("shardex ls ")]
    assert line.endswith("# " + ", ".join(names))


def test_ls_of_an_array_backend_gives_each_sample_its_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = shardex.export(
        {"image": [bytes([i]) * 4 for i in range(5)], "label": [0, 1, 0, 1, 0]},
        out,
        backend="torch",
        samples_per_shard=2,
        workers=1,
    )
    header, *lines = _ok("ls", str(out)).output.splitlines()
    assert header == LS_HEADER
    shards = [s.path for s in config.split("train").shards]
    keys = list(shardex.open_dataset(out).keys())
    assert [line.split("\t")[:5] for line in lines] == [
        ["train", key, shards[i // 2], "", ""] for i, key in enumerate(keys)
    ]


def test_get_shows_the_fields(
    exported: tuple[Path, Result], src: tuple[Path, dict[str, bytes]]
) -> None:
    out, _ = exported
    text = _ok("get", str(out), "dog/dog3").output
    assert "dog/dog3" in text
    assert "split train" in text
    assert f"jpg: {len(src[1]['dog/dog3.jpg'])} bytes" in text
    assert "cls: 1 bytes 1" in text  # dog is class 1 of (cat, dog)


def test_get_writes_the_exact_image_bytes(
    exported: tuple[Path, Result], src: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out, _ = exported
    for rel in ("cat/cat2.jpg", "dog/extra0.png"):
        dest = tmp_path / Path(rel).name
        result = _ok("get", str(out), rel.rsplit(".", 1)[0], "-o", str(dest))
        assert str(dest) in result.output
        assert dest.read_bytes() == src[1][rel]
    label = tmp_path / "label.txt"
    _ok("get", str(out), "cat/cat2", "-o", str(label), "--field", "cls")
    assert label.read_bytes() == b"0"


def test_get_unknown_key_fails_clearly(exported: tuple[Path, Result], tmp_path: Path) -> None:
    out, _ = exported
    result = _cli("get", str(out), "cat/nope")
    assert result.exit_code != 0
    assert "error: no sample with key 'cat/nope'" in result.stderr
    result = _cli("get", str(out), "cat/cat1", "-o", str(tmp_path / "x"), "--field", "txt")
    assert result.exit_code != 0
    assert "no field 'txt'" in result.stderr
    assert not (tmp_path / "x").exists()


def test_get_into_a_missing_folder_is_one_line(
    exported: tuple[Path, Result], tmp_path: Path
) -> None:
    out, _ = exported
    dest = tmp_path / "missing" / "x.jpg"
    result = _cli("get", str(out), "cat/cat0", "-o", str(dest))
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "missing" in line
    assert "create its folder first" in line
    assert not (tmp_path / "missing").exists()


def test_commands_on_a_folder_that_is_not_an_export(tmp_path: Path) -> None:
    for command in ("inspect", "ls"):
        result = _cli(command, str(tmp_path))
        assert result.exit_code != 0
        assert "is not a shardex export" in result.stderr
        assert "Traceback" not in result.output


def test_backend_list_shows_all_seven_backends() -> None:
    # CliRunner output is not a terminal, as `shardex backend list | grep ...` and CI logs
    result = _ok("backend", "list", "data-export")
    rows = {line.split("│")[1].strip() for line in result.output.splitlines() if "│" in line}
    expected = {"webdataset", "numpy", "numpy_mmap", "torch", "tensordict_memmap"}
    assert expected | {"tensor_shards", "zarr"} <= rows
    assert "yes" in result.output


def test_backend_list_data_loader_lists_loaders_and_the_backends_they_read() -> None:
    from shardex.backends.registry import REGISTRY

    result = CliRunner().invoke(main, ["backend", "list", "data-loader"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells[1:]
        for line in result.output.splitlines()
        if "│" in line and (cells := [c.strip() for c in line.split("│")[1:-1]])[0]
    }
    assert set(rows) == {"MapDataset", "StreamDataset", "TensorShardsLoader", "DALI", "Ray"}
    assert "webdataset" not in rows  # not the export table again
    caps = {e.name: REGISTRY.get(e.name).capabilities for e in REGISTRY.entries() if e.available}
    for loader, needs in [
        ("MapDataset", "random_access"),
        ("StreamDataset", "streaming"),
        ("TensorShardsLoader", "shard_windows"),
        ("DALI", "dali"),
    ]:
        listed = set(rows[loader][1].split(" (")[0].split(", "))
        assert listed == {name for name, c in caps.items() if getattr(c, needs)}, loader
    assert set(rows["Ray"][1].split(" (")[0].split(", ")) == set(caps)
    assert "tensor_shards" in rows["TensorShardsLoader"][1]
    assert "webdataset" not in rows["TensorShardsLoader"][1]
    assert rows["StreamDataset"][2] == "shardex.torch:StreamDataset"  # where to import it
    assert "bounded buffer shuffle" in result.output


def test_backend_list_gives_the_install_hint_of_a_missing_dependency() -> None:
    from shardex.backends.registry import REGISTRY, BackendEntry

    entry = BackendEntry("needs-x", "nowhere_x:B", ("nowhere_x",), "pip install xx")
    REGISTRY._entries["needs-x"] = entry
    try:
        result = _ok("backend", "list")
    finally:
        del REGISTRY._entries["needs-x"]
    assert "pip install xx" in result.output


# ---------------------------------------------------------------- splits


def test_split_fractions_are_recorded_in_config(
    src: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    flags = ["--split-fractions", "train=0.5,val=0.25,test=0.25", "--seed", "7", "--workers", "1"]
    result = _ok("export-dataset", str(src[0]), "-o", str(out), *flags, "-q")
    raw = yaml.safe_load((out / "config.yaml").read_text())
    assert raw["split_method"] == "fractions"
    assert raw["split_seed"] == 7
    assert raw["split_fractions"] == {"train": 0.5, "val": 0.25, "test": 0.25}
    counts = {name: info["num_samples"] for name, info in raw["splits"].items()}
    assert sum(counts.values()) == 12
    assert set(counts) <= {"train", "val", "test"}
    assert "exported 12 samples" in result.output
    inspect = _ok("inspect", str(out)).output
    assert "seed 7" in inspect
    # the same seed splits the same way
    again = tmp_path / "again"
    _ok("export-dataset", str(src[0]), "-o", str(again), *flags, "-q")
    for split in counts:
        keys = shardex.open_dataset(out, split=split).metadata.column("key").to_pylist()
        assert shardex.open_dataset(again, split=split).metadata.column("key").to_pylist() == keys


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("train=abc", "train=abc"),
        ("train0.8,val=0.2", "NAME=FRACTION"),
        ("train=0.5,val=0.2", "sum to 1"),
        ("train=1.5,val=-0.5", ">= 0"),
    ],
    ids=["not-a-number", "no-equals", "bad-sum", "negative"],
)
def test_bad_split_fractions_are_a_usage_error(
    src: tuple[Path, dict[str, bytes]], tmp_path: Path, value: str, expected: str
) -> None:
    out = tmp_path / "out"
    result = _cli("export-dataset", str(src[0]), "-o", str(out), "--split-fractions", value, "-q")
    assert result.exit_code != 0
    assert expected in result.stderr
    assert "Traceback" not in result.output
    assert not (out / "config.yaml").exists()


def test_split_option_exports_only_that_split(tmp_path: Path) -> None:
    rels = [
        *(f"train/{c}/t{i}.jpg" for c in ("a", "b") for i in range(3)),
        *(f"val/{c}/v{i}.jpg" for c in ("a", "b") for i in range(2)),
        *(f"test/a/s{i}.jpg" for i in range(2)),
    ]
    written = make_tree(tmp_path / "src", rels)
    out = tmp_path / "out"
    result = _ok("export-dataset", str(tmp_path / "src"), "-o", str(out), "--split", "val", "-q")
    assert "exported 4 samples (val 4)" in result.output
    config = shardex.read_config(out)
    assert list(config.splits) == ["val"]
    assert not (out / "train").exists()
    assert not (out / "test").exists()
    ds = shardex.open_dataset(out)
    assert sorted(ds.metadata.column("original_path").to_pylist()) == sorted(
        r for r in rels if r.startswith("val/")
    )
    for row in ds.metadata.to_pylist():
        assert ds.get(row["key"])["jpg"] == written[row["original_path"]]
    missing = _cli(
        "export-dataset", str(tmp_path / "src"), "-o", str(tmp_path / "o2"), "--split", "dev", "-q"
    )
    assert missing.exit_code != 0
    assert "dev" in missing.stderr
    assert "train, val, test" in missing.stderr


# ---------------------------------------------------------------- --config


def test_config_file_gives_options_and_flags_override_it(
    src: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    import tarfile

    out = tmp_path / "out"
    config = tmp_path / "nexuml.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "output": str(out),
                "samples_per_shard": 3,  # NexuML spelling
                "split-fractions": {"train": 0.5, "val": 0.5},
                "no-labels": True,
                "workers": 1,
                "no-preprocess": True,
                "quiet": True,
            }
        )
    )
    _ok("export-dataset", str(src[0]), "-c", str(config), "--samples-per-shard", "4")
    raw = yaml.safe_load((out / "config.yaml").read_text())
    assert raw["split_fractions"] == {"train": 0.5, "val": 0.5}
    shards = [s for split in raw["splits"].values() for s in split["shards"]]
    assert max(s["num_samples"] for s in shards) == 4  # the flag won over the file's 3
    members: list[str] = []
    for tar in out.rglob("*.tar"):
        with tarfile.open(tar) as f:
            members += f.getnames()
    assert members
    assert not any(m.endswith(".cls") for m in members)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sampels_per_shard: 3\n", "unknown option 'sampels_per_shard' (options: backend,"),
        ("mode: bogus\n", "option 'mode': 'bogus' is not one of"),
        ("workers: 0\n", "option 'workers': 0 is not in the range"),
        ("labels: maybe\n", "option 'labels':"),
        ("no-labels: 1\n", "option 'no-labels': expected true or false"),
        ("- a\n- b\n", "expected a mapping of option names to values, found a list"),
        ("a: [\n", "cannot read it as YAML"),
        # a list or mapping for a one-value flag, a float for an integer: the flag refuses
        # them on the command line, so the file must too (not a traceback, not a truncation)
        ("samples-per-shard: [1, 2]\n", "option 'samples-per-shard': expected one value"),
        ("samples-per-shard: 1.5\n", "option 'samples-per-shard': '1.5' is not a valid integer"),
        ("x-key: {a: 1}\n", "option 'x-key': expected a value or a list of values"),
        ("workers: true\n", "option 'workers': 'True' is not a valid integer"),
        # one option under two spellings: which one wins would be a guess
        (
            "samples-per-shard: 2\nsamples_per_shard: 3\n",
            "options 'samples-per-shard' and 'samples_per_shard' set the same option",
        ),
        ("labels: true\nno-labels: true\n", "options 'labels' and 'no-labels' set the same"),
    ],
)
def test_config_file_refuses_unknown_keys_and_bad_values_in_one_line(
    tmp_path: Path, content: str, message: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(content)
    result = _cli("export-dataset", "demo:5", "-o", str(tmp_path / "o"), "--config", str(config))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --config ")
    assert message in lines[0]
    assert not (tmp_path / "o").exists()


def test_config_file_null_leaves_the_option_at_its_default(tmp_path: Path) -> None:
    # `key:` with no value (YAML null), as a template leaves it, is the flag not given:
    # not a key named None, not mode None
    config = tmp_path / "c.yaml"
    config.write_text("x-key:\nmode:\nno-labels:\nsamples-per-shard: 2\n")
    _ok("export-dataset", "demo:4", "-o", str(tmp_path / "o"), "-c", str(config), "-q")
    done = shardex.read_config(tmp_path / "o")
    assert done.x_keys == ("image",)
    assert done.label_names is not None
    assert [s.num_samples for s in done.splits["train"].shards] == [2, 2]


def test_piped_output_is_never_wrapped(
    src: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off a terminal (CliRunner's output, like `| cat` or a CI log) each line is as wide
    as it needs: rich would lay it out in 80 columns and fold words."""
    monkeypatch.delenv("COLUMNS", raising=False)
    lines = _ok("backend", "list").output.splitlines()
    codec = "option image_codec: none (default), png, webp (lossless) or jpeg (lossy)"
    assert any(codec in line and "one image per chunk" in line for line in lines)
    out = tmp_path / ("a-folder-name-long-enough-to-pass-80-columns-" * 2) / "export"
    _ok("export-dataset", str(src[0]), "-o", str(out), "--workers", "1", "-q")
    lines = _ok("inspect", str(out)).output.splitlines()
    config = shardex.read_config(out)
    assert lines[0] == (
        f"{out}: backend webdataset, format {config.format_version}, 12 samples, "
        f"written by shardex {config.shardex_version}"
    )
    (storage,) = [x for x in lines if x.startswith("│ image")]
    assert "tar:jpg|png " in storage
