"""Peak RSS (VmHWM) and time of re-exports: a ``webdataset`` export on SeaweedFS and a
local ``torch`` export, each of 1,000 and 4,000 62 KB JPEGs, re-exported to local disk
by a fresh process (``workers=1``), with a baseline tree and this one in the same run.

    python benchmarks/bench_reexport_memory.py --baseline /tmp/base/src

(``--baseline``: the ``src`` folder of the tree to compare with, e.g. ``git archive
84295d6 src | tar -x -C /tmp/base``.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

import shardex  # noqa: E402
from shardex.testing.data import make_image  # noqa: E402
from tests.support.seaweedfs import SeaweedFS  # noqa: E402

_CODE = (
    "import json, sys, time, shardex\n"
    "t = time.perf_counter()\n"
    "shardex.export(sys.argv[1], sys.argv[2], workers=1, samples_per_shard=64,\n"
    "               source_storage_options=json.loads(sys.argv[3]) or None)\n"
    "print(time.perf_counter() - t)\n"
    "print([ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1])"
)


def _peak(
    src_path: str, source: str, out: Path, options: dict[str, str] | None
) -> tuple[int, float]:
    """(peak RSS in MB, seconds) of one re-export with the code under ``src_path``."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": src_path, "AWS_METADATA_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", _CODE, source, str(out), json.dumps(options)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, kb = done.stdout.split()[-2:]
    return int(kb) // 1024, float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", required=True, help="src folder of the baseline tree")
    args = parser.parse_args()
    image = make_image(7, size=(370, 270))
    trees = (("baseline", args.baseline), ("this tree", str(ROOT / "src")))
    with tempfile.TemporaryDirectory() as tmp, SeaweedFS(bucket="bench") as server:
        options = {
            "access_key_id": server.access_key,
            "secret_access_key": server.secret_key,
            "region": server.region,
            "endpoint_url": server.endpoint,
        }
        for n in (1000, 4000):
            source = {
                "key": [f"s{i:05d}" for i in range(n)],
                "jpg": [image] * n,
                "label": [i % 3 for i in range(n)],
            }
            url = f"s3://bench/src{n}"
            shardex.export(source, url, samples_per_shard=64, workers=1, storage_options=options)
            local = Path(tmp) / f"torch{n}"
            shardex.export(source, local, backend="torch", samples_per_shard=64, workers=1)
            for name, src_path in trees:
                for kind, where, opts in (
                    ("s3 webdataset", url, options),
                    ("local torch", str(local), None),
                ):
                    mb, seconds = _peak(src_path, where, Path(tmp) / "out", opts)
                    print(f"{n:>5} {kind:<14} {name:<10} peak {mb:>5} MB  {seconds:6.1f} s")


if __name__ == "__main__":
    main()
