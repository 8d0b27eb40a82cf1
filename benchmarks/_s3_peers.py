"""Random reads in a DataLoader on SeaweedFS: shardex against MosaicML Streaming and LitData.

Issue 36's comparison, as a script anyone can run. A SeaweedFS on 127.0.0.1 holds the
same N JPEGs of about 16 KB (``bench_format.py``'s seeded generator) written by each
library: ``shardex.export`` (1000 samples a shard, ~16 MB), MosaicML's ``MDSWriter`` and
LitData's ``optimize`` (8 MiB shards/chunks, no compression: the largest power of two that
MosaicML accepts with a 64 MB cache, which must hold 4 shards; written locally, then
uploaded). Every read goes through a :class:`tests.support.proxy.CountingProxy` that holds
each request ``delay`` ms (0, 10, 40: a distant store's round trip) and counts requests and
bytes, so every reader is measured the same way.

For each delay, each reader runs in a fresh process for ``--seconds`` (all in: dataset
construction, index downloads and worker start count), then is stopped: a torch
``DataLoader`` with 2 workers, batches of 64, raw bytes (no decode), ``collate_fn`` a list:

* shardex: ``MapDataset(url, decode=False)`` with a ``RandomSampler`` (uniformly random);
* MosaicML Streaming: ``StreamingDataset(remote, local=tmp, cache_limit="64mb",
  shuffle=True, shuffle_algo="naive", batch_size=64)``: ``naive`` is its most random
  shuffle (a global permutation of the samples);
* LitData: ``StreamingDataset(input_dir, cache_dir=tmp, max_cache_size="64MB",
  shuffle=True)``: its only shuffle, chunks in a random order and samples shuffled
  within them (not uniformly random: each chunk is read whole once an epoch);
* LitData ``ds[i]``: the same dataset (``shuffle=False``) read with ``ds[i]`` in a
  ``RandomSampler``'s order (uniformly random, as shardex), through a map-style wrapper,
  whole chunks fetched into the 64 MB cache (``on_demand_bytes`` off, as its iterator);
* LitData ``ds[i] ranged``: the same with ``ds[i]``'s default, two ranged GETs a sample
  (its offsets, then its bytes) and no cache.

LitData's chunk GETs go through obstore with client options that refuse ``http://``; the
child allows it (real S3 is https). MosaicML is imported without ``streaming/__init__``
(which imports torchvision, whose CUDA build fails to load beside a CPU torch).

The peers' local caches are limited to 64 MB, smaller than the ~320 MB dataset. A row:
samples/s, GETs and bytes fetched per sample (at the proxy, over the whole run), the
local cache's size at the end and its peak (sampled every second; shardex's is its
index copies), and a status. A reader that fails before its time box ends is started
again (fresh process and cache), up to 3 starts; the row is its last start's, and
``failed_starts`` lists why the earlier ones failed (MosaicML Streaming often fails within
2 s with an IndexError reading a shard, at random).

Usage::

    .venv/bin/python benchmarks/_s3_peers.py [--samples 20000] [--delays 0,40]
        [--seconds 60] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_format import DEFAULT_WORKDIR, build_folder, image_relpath

BATCH = 64
WORKERS = 2
SIZE_KB = 16
CACHE = "64MB"
PEER_SHARD_BYTES = 8 << 20
SEED = 36
STARTS = 3  # a reader that fails within its time box is started again, up to this often
STARTUP_GRACE = 60.0  # a child that has not reported this long after its time box is killed

READERS = ("shardex", "mosaicml-streaming", "litdata", "litdata ds[i]", "litdata ds[i] ranged")
_LITDATA = ("litdata", "pip install 'shardex[bench]'")
INSTALL = {
    "mosaicml-streaming": (
        "streaming",
        "pip install --no-deps mosaicml-streaming==0.13.0 catalogue xxhash and the "
        "writer's packages in benchmarks/README.md",
    ),
    "litdata": _LITDATA,
    "litdata ds[i]": _LITDATA,
    "litdata ds[i] ranged": _LITDATA,
}
COPY = {"litdata ds[i]": "litdata", "litdata ds[i] ranged": "litdata"}  # another's copy


# ---------------------------------------------------------------- data, once per run


def _streaming(module: str) -> Any:
    """A module of MosaicML Streaming, imported without the package ``__init__``.

    ``import streaming`` imports its vision and text modules too (torchvision,
    transformers). Where torchvision's binary does not fit the installed torch (a CPU
    torch with a CUDA torchvision: ``operator torchvision::nms does not exist``), that
    import fails; the dataset and writer modules need neither (as ``bench_format``'s
    ``mds_writer``, which catches ImportError only).
    """
    import types

    if "streaming" in sys.modules:  # the real package, or the stubs below
        return importlib.import_module(module)
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mosaicml-streaming is not installed")
    root = next(iter(spec.submodule_search_locations))
    for name, sub in (("streaming", ""), ("streaming.base", "/base")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [root + sub]
            sys.modules[name] = package
    return importlib.import_module(module)


def _label(rel: str) -> int:
    return int(rel.split("/", 1)[0].removeprefix("class_"))


def _litdata_item(path: str) -> dict[str, Any]:
    """One sample for ``litdata.optimize``: the image's bytes and its class."""
    rel = "/".join(Path(path).parts[-2:])
    return {"jpg": Path(path).read_bytes(), "cls": _label(rel)}


def _upload(server: Any, local: Path, prefix: str) -> int:
    """Every file under ``local`` to ``prefix/`` of the server's bucket; the bytes sent."""
    import obstore

    store = server.store(prefix)
    total = 0
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        data = path.read_bytes()
        obstore.put(store, path.relative_to(local).as_posix(), data)
        total += len(data)
    return total


def write_all(server: Any, folder: Path, count: int, scratch: Path, readers: list[str]) -> dict:
    """Each reader's copy of the images in the server's bucket: {reader: url}."""
    rels = sorted(image_relpath(i) for i in range(count))
    urls = {}
    t0 = time.perf_counter()
    import shardex

    urls["shardex"] = server.url("shardex")
    options = {
        "endpoint_url": server.endpoint,
        "region": server.region,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
    }
    shardex.export(folder, urls["shardex"], storage_options=options, workers=2)
    print(f"  shardex export: {time.perf_counter() - t0:.1f} s", flush=True)
    if "mosaicml-streaming" in readers:
        t0 = time.perf_counter()
        out = scratch / "mds"
        writer = _streaming("streaming.base.format.mds.writer").MDSWriter
        with writer(
            out=str(out), columns={"jpg": "bytes", "label": "int"}, size_limit=PEER_SHARD_BYTES
        ) as w:
            for rel in rels:
                w.write({"jpg": (folder / rel).read_bytes(), "label": _label(rel)})
        _upload(server, out, "mds")
        urls["mosaicml-streaming"] = server.url("mds")
        print(f"  MDSWriter + upload: {time.perf_counter() - t0:.1f} s", flush=True)
    if any(r.startswith("litdata") for r in readers):
        import litdata

        t0 = time.perf_counter()
        out = scratch / "litdata"
        litdata.optimize(
            fn=_litdata_item, inputs=[str(folder / rel) for rel in rels], output_dir=str(out),
            chunk_bytes=PEER_SHARD_BYTES, num_workers=1, reorder_files=False, mode="overwrite",
            verbose=False,
        )  # fmt: skip
        _upload(server, out, "litdata")
        urls["litdata"] = server.url("litdata")
        print(f"  litdata.optimize + upload: {time.perf_counter() - t0:.1f} s", flush=True)
    return urls


# ---------------------------------------------------------------- one reader, in a child


def _tree_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _loader(spec: dict[str, Any]) -> tuple[Any, str]:
    """The reader's DataLoader and the column holding the image bytes."""
    from torch.utils.data import DataLoader, RandomSampler

    reader, url, cache = spec["reader"], spec["url"], spec["cache"]
    if reader == "shardex":
        from shardex.torch import MapDataset

        ds = MapDataset(url, "train", decode=False, storage_options=spec["shardex_options"])
        n = len(ds)
        sampler = RandomSampler(range(n), num_samples=100 * n)  # 100 epochs, never reached
        return ds.dataloader(
            batch_size=BATCH, num_workers=WORKERS, sampler=sampler, collate_fn=_as_list
        ), "jpg"
    if reader == "mosaicml-streaming":
        dataset = _streaming("streaming.base.dataset")  # before its util (circular imports)
        _streaming("streaming.base.util").clean_stale_shared_memory()
        ds = dataset.StreamingDataset(
            remote=url, local=cache, cache_limit=CACHE.lower(), shuffle=True,
            shuffle_algo="naive", shuffle_seed=SEED, batch_size=BATCH,
        )  # fmt: skip
        return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_as_list), "jpg"
    if reader.startswith("litdata"):
        import litdata.streaming.downloader as downloader
        from litdata import StreamingDataset

        # LitData's chunk GETs go through obstore with fixed client options that refuse
        # http:// (real S3 is https): allow it, or every chunk GET fails with BadScheme.
        downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
            **downloader._OBSTORE_CLIENT_OPTIONS,  # type: ignore[attr-defined]
            "allow_http": True,
        }
        shuffle = reader == "litdata"
        ds = StreamingDataset(
            input_dir=url, cache_dir=cache, max_cache_size=CACHE, shuffle=shuffle, seed=SEED,
            storage_options=spec["boto_options"],
        )  # fmt: skip
        if not shuffle:  # random access: ds[i] in a uniformly random order
            # ds[i] fetches just the sample's bytes (two ranged GETs, nothing cached) by
            # default; "litdata ds[i]" makes it fetch whole chunks into its cache, as its
            # iterator does. The property's setter needs the cache: set its field.
            ds._on_demand_bytes = reader.endswith("ranged")
            indexed = _Indexed(ds)
            sampler = RandomSampler(range(len(indexed)), num_samples=100 * len(indexed))
            return DataLoader(
                indexed, batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
                collate_fn=_as_list,
            ), "jpg"  # fmt: skip
        return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_as_list), "jpg"
    raise ValueError(reader)


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


class _Indexed:
    """A map-style view of an iterable dataset with ``__getitem__`` (LitData's), for a
    sampler: the DataLoader refuses a sampler over an IterableDataset."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]


def child(spec: dict[str, Any]) -> None:
    """Read for ``spec["seconds"]``, then write the counts to ``spec["out"]`` and exit."""
    os.environ.update(spec["env"])
    state: dict[str, Any] = {"samples": 0, "payload": 0, "first_batch_s": None, "cache_max": 0}
    start = time.perf_counter()
    lock = threading.Lock()

    def finish(status: str) -> None:
        with lock:
            cache = _tree_bytes(spec["cache"])
            result = {
                **state,
                "elapsed": time.perf_counter() - start,
                "cache_bytes": cache,
                "cache_max": max(state["cache_max"], cache),
                "status": status,
            }
            tmp = spec["out"] + ".tmp"
            Path(tmp).write_text(json.dumps(result))
            os.replace(tmp, spec["out"])
            os._exit(0)  # the workers are the parent's to end (the process group)

    def watchdog() -> None:
        while True:
            left = spec["seconds"] - (time.perf_counter() - start)
            if left <= 0:
                finish("ok" if state["samples"] else "timed out without a batch")
            time.sleep(min(1.0, left))
            state["cache_max"] = max(state["cache_max"], _tree_bytes(spec["cache"]))

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        loader, column = _loader(spec)
        while True:  # epochs (shardex's sampler never ends)
            for batch in loader:
                state["payload"] += sum(len(sample[column]) for sample in batch)
                state["samples"] += len(batch)
                if state["first_batch_s"] is None:
                    state["first_batch_s"] = time.perf_counter() - start
    except BaseException as exc:  # one line of why, in the row
        import traceback

        traceback.print_exc()  # to the child's log
        lines = str(exc).strip().splitlines()  # a worker's error: its last line says why
        line = lines[-1] if lines else ""
        if not line.partition(" ")[0].endswith(":"):  # not "IndexError: ..." already
            line = f"{type(exc).__name__}: {line}"
        finish(f"failed: {line}"[:240])


# ---------------------------------------------------------------- the parent


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one reader in a fresh process (its own process group, ended afterwards)."""
    out = Path(spec["out"])
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(spec["out"] + ".log", "w"),  # noqa: SIM115 (the child's to write)
    )
    with contextlib.suppress(subprocess.TimeoutExpired):  # a hung child: killed below
        proc.wait(timeout=spec["seconds"] + STARTUP_GRACE)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child's DataLoader workers too
    proc.wait()
    if out.exists():
        got = json.loads(out.read_text())
        if got["status"].startswith("failed"):
            print(Path(spec["out"] + ".log").read_text(errors="replace")[-3000:], file=sys.stderr)
        return got
    log = Path(spec["out"] + ".log").read_text(errors="replace").strip().splitlines()
    why = log[-1][:200] if log else f"exit status {proc.returncode}"
    return {"samples": 0, "payload": 0, "status": f"failed: {why}", "elapsed": spec["seconds"]}


def _not_installed(reader: str) -> str | None:
    if reader not in INSTALL:
        return None
    module, how = INSTALL[reader]
    return None if importlib.util.find_spec(module) else f"not installed: {how}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def run_peers(
    samples: int, delays: list[int], seconds: float, readers: tuple[str, ...] = READERS
) -> list[dict[str, Any]]:
    """One row per (reader, delay in ms): samples/s of random reads in a DataLoader, GETs
    and bytes fetched per sample, the local cache used, and a status."""
    from tests.support.proxy import CountingProxy
    from tests.support.seaweedfs import SeaweedFS, loopback_only_environment

    loopback_only_environment()
    folder = build_folder(DEFAULT_WORKDIR, samples, SIZE_KB)
    missing = {r: _not_installed(r) for r in readers}
    present = [r for r in readers if missing[r] is None]
    rows: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-s3-peers-"))
    try:
        with SeaweedFS(bucket="peers") as server, CountingProxy(server.endpoint) as proxy:
            print(f"writing {samples} images with {', '.join(present)}:", flush=True)
            urls = write_all(server, folder, samples, scratch, present)
            env = {
                **server.environ(endpoint=proxy.endpoint),  # boto3 (LitData), obstore
                "S3_ENDPOINT_URL": proxy.endpoint,  # MosaicML Streaming's boto3
            }
            for delay in delays:
                for reader in readers:
                    row: dict[str, Any] = {"reader": reader, "delay_ms": delay}
                    if missing[reader]:
                        rows.append({**row, "status": missing[reader]})
                        print(f"{reader:>20} {delay:3d} ms: {missing[reader]}", flush=True)
                        continue
                    cache = scratch / f"cache-{reader}-{delay}"
                    spec = {
                        "reader": reader,
                        "url": urls[COPY.get(reader, reader)],
                        "cache": str(cache),
                        "seconds": seconds,
                        "out": str(scratch / f"result-{reader}-{delay}.json"),
                        "env": {**env, "SHARDEX_CACHE_DIR": str(cache)},
                        "shardex_options": {
                            "endpoint_url": proxy.endpoint,
                            "region": server.region,
                            "access_key_id": server.access_key,
                            "secret_access_key": server.secret_key,
                        },
                        "boto_options": {
                            "endpoint_url": proxy.endpoint,
                            "aws_access_key_id": server.access_key,
                            "aws_secret_access_key": server.secret_key,
                            "region_name": server.region,
                        },
                    }
                    earlier: list[str] = []  # the failed starts before the one reported
                    for start in range(STARTS):
                        cache.mkdir(exist_ok=True)
                        proxy.latency = delay / 1000
                        proxy.reset()
                        got = _run_child(spec)
                        proxy.wait_idle(30)
                        records = proxy.requests
                        proxy.latency = 0.0
                        shutil.rmtree(cache, ignore_errors=True)
                        if not got["status"].startswith("failed") or start == STARTS - 1:
                            break
                        earlier.append(got["status"])
                        print(f"{reader:>20} {delay:3d} ms: {got['status']}; again", flush=True)
                    n, payload = got["samples"], got["payload"]
                    fetched = sum(r.body_bytes for r in records)
                    gets = sum(r.method == "GET" for r in records)
                    row.update(
                        samples_per_s=n / got["elapsed"],
                        samples=n,
                        gets_per_sample=gets / n if n else None,
                        bytes_per_payload=fetched / payload if payload else None,
                        cache_bytes=got.get("cache_bytes"),
                        cache_bytes_max=got.get("cache_max"),
                        first_batch_s=got.get("first_batch_s"),
                        requests=len(records),
                        gets=gets,
                        bytes_fetched=fetched,
                        payload_bytes=payload,
                        seconds=got["elapsed"],
                        status=got["status"],
                        failed_starts=earlier,
                    )
                    rows.append(row)
                    print(_line(row), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _line(r: dict[str, Any]) -> str:
    if "samples" not in r:
        return f"{r['reader']:>20} {r['delay_ms']:3d} ms: {r['status']}"
    again = f" (after {len(r['failed_starts'])} failed starts)" if r["failed_starts"] else ""
    return (
        f"{r['reader']:>20} {r['delay_ms']:3d} ms: {r['samples_per_s']:7.0f} samples/s "
        f"({r['samples']} in {r['seconds']:.0f} s, first batch at "
        f"{_num(r['first_batch_s'], '.1f')} s), {_num(r['gets_per_sample'], '.3f')} GETs "
        f"and {_num(r['bytes_per_payload'], '.2f')}x the bytes a sample "
        f"({r['bytes_fetched'] / 1e6:,.0f} MB fetched), cache {r['cache_bytes'] / 1e6:.1f} MB "
        f"(peak {r['cache_bytes_max'] / 1e6:.1f} MB): {r['status']}{again}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--delays", default="0,40", help="ms each request is held, e.g. 0,10,40")
    parser.add_argument("--seconds", type=float, default=60.0, help="each reader's time box")
    parser.add_argument("--readers", default=",".join(READERS), help="a comma-separated subset")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    delays = [int(d) for d in args.delays.split(",")]
    started = time.perf_counter()
    readers = tuple(r.strip() for r in args.readers.split(","))
    if unknown := set(readers) - set(READERS):
        parser.error(f"unknown readers {sorted(unknown)}: choose from {', '.join(READERS)}")
    rows = run_peers(args.samples, delays, args.seconds, readers)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        versions = {d: _version(d) for d in ("shardex", "torch", "mosaicml-streaming", "litdata")}
        doc = {
            "samples": args.samples,
            "size_kb": SIZE_KB,
            "seconds": args.seconds,
            "batch": BATCH,
            "workers": WORKERS,
            "cache_limit": CACHE,
            "peer_shard_bytes": PEER_SHARD_BYTES,
            "versions": versions,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
