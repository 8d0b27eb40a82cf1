"""Export the same inputs with every backend, 1 and 2 workers (and Ray with --ray), into
one folder, to compare two versions of shardex byte for byte:

    PYTHONPATH=/old/checkout/src python scripts/export_matrix.py /tmp/old
    python scripts/export_matrix.py /tmp/new
    diff -r /tmp/old /tmp/new && echo identical

Inputs (made here, the same each run): the demo images, a folder of images with
``[split/][class/]`` names and two broken files (``--on-error skip``), a Parquet table
of the same images' paths with a score and an embedding column, and in-memory arrays
(``shardex.export`` of a mapping, in batches of 25: JPEG bytes with two broken ones and a
repeated key, a 2-d float32 array, strings and labels). config.yaml records the
shardex version, which this script blanks so that two versions can compare, and the
inputs' path, which stays the same (``--inputs``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BACKENDS = (
    "webdataset",
    "numpy",
    "numpy_mmap",
    "tensor_shards",
    "tensordict_memmap",
    "torch",
    "zarr",
)


def _inputs(root: Path) -> dict[str, list[str]]:
    """The sources (a path or name, and the options each needs), made under ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardex.testing import make_image

    folder = root / "folder"
    rows = []
    for i in range(90):
        split = ("train", "val")[i % 3 == 0]
        path = folder / split / f"class{i % 4}" / f"img{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = make_image(i) if i not in (7, 41) else b"\xff\xd8 broken"
        path.write_bytes(data)
        if i not in (7, 41):
            rows.append((str(path.relative_to(root)), i % 4, i / 90, [float(i), float(-i), 0.5]))
    table = root / "table.parquet"
    pq.write_table(
        pa.table(
            {
                "image_path": [r[0] for r in rows],
                "label": [r[1] for r in rows],
                "score": [r[2] for r in rows],
                "embedding": pa.array([r[3] for r in rows], pa.list_(pa.float32(), 3)),
            }
        ),
        table,
    )
    return {
        "arrays": [],  # see _ARRAYS
        "demo": ["demo:120", "--split-fractions", "train=0.7,val=0.3"],
        "folder": [str(folder), "--on-error", "skip"],
        "table": [str(table), "--x-key", "image", "--x-key", "embedding"],
    }


#: The in-memory input, exported through the API: argv OUT BACKEND WORKERS [ray].
_ARRAYS = """
import sys
import numpy as np
import shardex
from shardex.sources import ArraySource
from shardex.testing import make_image
n = 60
jpg = [make_image(i) for i in range(n)]
jpg[5] = b"\\xff\\xd8 broken"
jpg[33] = bytearray(b"not an image")
keys = [f"k{i:03d}" for i in range(n)]
keys[20] = keys[19]
data = {
    "key": keys,
    "jpg": jpg,
    "x": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
    "txt": [f"caption {i}" for i in range(n)],
    "label": [i % 3 for i in range(n)],
}
out, backend, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
shardex.export(
    ArraySource(data, batch_size=25), out, backend=backend, workers=workers,
    samples_per_shard=17, on_error="skip", split_fractions={"train": 0.7, "val": 0.3},
    executor="ray" if sys.argv[4:] else "local",
)
print(f"exported to {out}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ray", action="store_true", help="also export with --executor ray")
    parser.add_argument(
        "--inputs",
        type=Path,
        default=Path(tempfile.gettempdir()) / "shardex-matrix-inputs",
        help="where the inputs are made (config.yaml records their path: keep it the same)",
    )
    args = parser.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(args.inputs, ignore_errors=True)
    inputs = _inputs(args.inputs)
    runs = [(w, []) for w in (1, 2)]
    if args.ray:
        runs.append((2, ["--executor", "ray"]))
    for name, source in inputs.items():
        for backend in BACKENDS:
            for workers, extra in runs:
                if extra and backend != "webdataset":
                    continue
                target = out / f"{name}-{backend}-{workers}{'-ray' if extra else ''}"
                if name == "arrays":
                    cmd = [sys.executable, "-c", _ARRAYS, str(target), backend, str(workers)]
                    cmd += ["ray"] if extra else []
                else:
                    cmd = [sys.executable, "-m", "shardex.cli", "export-dataset", *source]
                    cmd += ["-o", str(target), "--backend", backend, "--workers", str(workers)]
                    cmd += ["--samples-per-shard", "17", "-q", *extra]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    print(f"{target.name}: {done.stderr.strip().splitlines()[-1]}")
                    continue
                config = target / "config.yaml"
                text = re.sub(r"(?m)^(\s*shardex_version:).*$", r"\1 -", config.read_text())
                config.write_text(text)
                print(f"{target.name}: {done.stdout.strip().splitlines()[0]}")


if __name__ == "__main__":
    main()
