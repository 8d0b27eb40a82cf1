"""A symbolic link planted inside a local output (by anyone who can write into a shared
folder) never makes an export write, truncate, rename or delete outside it: the export
is refused in one line naming the link, and the link's target is untouched."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import shardex
from helpers import files_of, kill_once_shards_appear
from shardex.backends.ownership import INTENT_FILE
from shardex.contract import ERRORS_FILE
from shardex.errors import ShardexError
from shardex.storage.local import LocalStorage
from shardex.storage.lock import LOCK_FILE

OPTIONS = {"samples_per_shard": 10, "workers": 1}
KILLED = (
    "import sys, shardex\n"
    "shardex.export('demo:400', sys.argv[1], samples_per_shard=10, workers=1)\n"
)


def _names(folder: Path) -> dict[str, bool]:
    """Every path under ``folder`` (relative), True for a folder."""
    return {p.relative_to(folder).as_posix(): p.is_dir() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, bool]]:
    """A committed export, a killed one, and every name either holds (plus the control
    files an export makes and removes while it runs)."""
    root = tmp_path_factory.mktemp("links")
    done, killed = root / "done", root / "killed"
    shardex.export("demo:40", done, **OPTIONS)
    kill_once_shards_appear(KILLED, [str(killed)], killed)
    names = {**_names(done), **_names(killed)}
    for control in (LOCK_FILE, INTENT_FILE, ERRORS_FILE):
        names.setdefault(control, False)
    return done, killed, names


def _outside(root: Path) -> dict[str, object]:
    """What a link's targets hold: every entry with its bytes (files) and its mode."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None, p.lstat().st_mode)
        for p in sorted(root.rglob("*"))
    }


MODES = {
    "export": ("demo:40", "error"),
    "overwrite": ("demo:40", "overwrite"),
    "append": ("demo:60", "append"),
    "resume": ("demo:400", "resume"),
}


@pytest.mark.parametrize("case", list(MODES))
def test_a_link_at_any_name_an_export_writes_is_refused_and_its_target_untouched(
    case: str, outputs: tuple[Path, Path, dict[str, bool]], tmp_path: Path
) -> None:
    done, killed, names = outputs
    source, mode = MODES[case]
    victims = tmp_path / "victims"
    (victims / "folder").mkdir(parents=True)
    (victims / "file.txt").write_bytes(b"precious\n")
    (victims / "folder" / "inside.txt").write_bytes(b"precious too\n")
    before = _outside(victims)
    assert len(names) >= 10, sorted(names)  # shards, sidecars, index, lists, control files
    for name, is_folder in sorted(names.items()):
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        if case in ("overwrite", "append"):
            shutil.copytree(done, out, symlinks=True)
        elif case == "resume":
            shutil.copytree(killed, out, symlinks=True)
        else:
            out.mkdir()
        planted = out / name
        if planted.is_dir():
            shutil.rmtree(planted)
        planted.unlink(missing_ok=True)
        planted.parent.mkdir(parents=True, exist_ok=True)
        planted.symlink_to(victims / ("folder" if is_folder else "file.txt"))
        extra = {"on_error": "skip"} if case == "append" else {}
        with pytest.raises(ShardexError) as refused:
            shardex.export(source, out, mode=mode, **OPTIONS, **extra)  # type: ignore[arg-type]
        message = str(refused.value)
        assert "\n" not in message and "symbolic link" in message, (name, message)
        assert str(planted) in message, (name, message)
        assert _outside(victims) == before, f"{case}: a link at {name} changed its target"
        assert planted.is_symlink(), name  # refused: nothing replaced it either


def test_a_link_planted_while_an_export_runs_is_never_written_through(tmp_path: Path) -> None:
    """Past the check at the start: the writer opens each folder without following a
    link, so a folder swapped for a link afterwards is refused, never written into."""
    victims = tmp_path / "victims"
    victims.mkdir()
    storage = LocalStorage(tmp_path / "out")
    storage.put("train/a.bin", b"a")
    shutil.rmtree(tmp_path / "out" / "train")
    (tmp_path / "out" / "train").symlink_to(victims)
    for act in (
        lambda: storage.put("train/b.bin", b"b"),
        lambda: storage.rename("c.bin", "train/c.bin"),
        lambda: storage.delete("train/a.bin"),
    ):
        if not (tmp_path / "out" / "c.bin").exists():
            storage.put("c.bin", b"c")
        with pytest.raises(ShardexError, match="symbolic link inside the output"):
            act()
    (victims / "a.bin").write_bytes(b"theirs")
    with pytest.raises(ShardexError, match="symbolic link"):
        storage.delete("train/a.bin")
    assert files_of(victims) == {"a.bin": b"theirs"}
    os.symlink(victims / "a.bin", tmp_path / "out" / "d.bin")
    writer = storage.open_writer("d.bin")
    writer.write(b"d")
    with pytest.raises(ShardexError, match="symbolic link"):
        writer.commit()
    assert files_of(victims) == {"a.bin": b"theirs"}
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]


def test_a_hard_link_at_the_lock_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    (tmp_path / "out").mkdir()
    os.link(victim, tmp_path / "out" / LOCK_FILE)
    with pytest.raises(ShardexError, match="not a plain file of its own"):
        shardex.export("demo:20", tmp_path / "out", **OPTIONS)
    assert victim.read_bytes() == b"precious\n"
