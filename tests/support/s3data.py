"""Test data and checks shared by the tests of sources on S3 and of Ray exports: a test's
prefix of the bucket (:class:`S3Location`, what the ``s3`` fixture gives), tars made in
memory, uploads, and checks of what the counting proxy saw."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
import urllib.parse
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helpers import files_of, image_bytes
from shardex.storage import ObjectStorage, Storage
from tests.support.proxy import CountingProxy, RequestRecord
from tests.support.seaweedfs import SeaweedFS


@dataclass(frozen=True)
class S3Location:
    """A fresh prefix of the test bucket, reachable directly or through the proxy."""

    url: str
    direct: dict[str, Any]  # storage_options to the server
    counted: dict[str, Any]  # storage_options through the counting proxy
    proxy: CountingProxy
    server: SeaweedFS

    def child(self, name: str) -> str:
        return f"{self.url}/{name}"


def upload(storage: Storage, files: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: storage.put(*kv), files.items()))


def same_export(local: Path, remote: Path, source_uri: str) -> None:
    """The two exports hold the same files, byte for byte, but for the source's URI."""
    a, b = files_of(local), files_of(remote)
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == ["config.yaml"]
    ca, cb = yaml.safe_load(a["config.yaml"]), yaml.safe_load(b["config.yaml"])
    assert cb["source_datasets"][0]["uri"] == source_uri
    for config in (ca, cb):
        del config["source_datasets"][0]["uri"]
    assert ca == cb


def tar_of(samples: list[tuple[str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for key, image, label in samples:
            meta = json.dumps({"score": label / 2}).encode()
            for ext, data in (("jpg", image), ("cls", str(label).encode()), ("json", meta)):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def ranges_asked(records: list[RequestRecord]) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` that ranged GETs asked for."""
    out = []
    for r in records:
        assert r.range is not None, r
        assert r.range.startswith("bytes="), r
        first, _, last = r.range[len("bytes=") :].partition("-")
        out.append((int(first), int(last) + 1))
    return out


def noise_jpeg(seed: int, side: int = 280) -> bytes:
    """A JPEG of about 100 KB (noise does not compress)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


def fetched_once_each(gets: list[RequestRecord], tars: dict[str, bytes]) -> None:
    """Every byte of every tar was fetched by exactly one of ``gets`` (ranged GETs)."""
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for record, span in zip(gets, ranges_asked(gets), strict=True):
        assert record.status == 206, record
        spans[record.key.rsplit("/", 1)[-1]].append(span)
    assert sorted(spans) == sorted(tars)
    for name, data in tars.items():
        got = sorted(spans[name])
        assert got[0][0] == 0, (name, got[0])
        assert got[-1][1] == len(data), (name, got[-1])
        assert all(a[1] == b[0] for a, b in itertools.pairwise(got)), name  # no gap, no overlap


def tars_here_and_on_s3(tars: dict[str, bytes], folder: Path, s3: S3Location, prefix: str) -> str:
    """The tars written into ``folder`` and uploaded under ``prefix``; the source URL."""
    folder.mkdir()
    for name, data in tars.items():
        (folder / name).write_bytes(data)
    upload(ObjectStorage(s3.child(prefix), s3.direct), tars)
    return s3.child(f"{prefix}/")


def put_raw(s3: S3Location, name: str, data: bytes) -> None:
    """Write an object whose name shardex itself refuses to write (another S3 client's),
    through the server's filer API."""
    prefix = s3.url.split("/", 3)[3]
    quoted = urllib.parse.quote(f"{prefix}/{name}")
    url = f"http://127.0.0.1:{s3.server.ports['filer']}/buckets/{s3.server.bucket}/{quoted}"
    body = b"--x\r\nContent-Disposition: form-data; name=file; filename=f.jpg\r\n\r\n"
    body += data + b"\r\n--x--\r\n"
    headers = {"Content-Type": "multipart/form-data; boundary=x"}
    urllib.request.urlopen(urllib.request.Request(url, body, headers, method="POST")).close()


def labelled_tars(count: int, per_tar: int) -> dict[str, bytes]:
    """``count`` tars of ``per_tar`` labelled samples, each in a folder of its own."""
    return {
        f"t{t}/part-{t}.tar": tar_of(
            [(f"s{t}_{i:03d}", image_bytes(t * per_tar + i), i % 3) for i in range(per_tar)]
        )
        for t in range(count)
    }


def huge_size(tar: bytes, member: str) -> bytes:
    """``tar`` with ``member``'s header claiming 8 GiB - 1 (its checksum made right)."""
    out = bytearray(tar)
    at = 0
    while out[at : at + 100].rstrip(b"\0").decode() != member:
        size = int(out[at + 124 : at + 135], 8)
        at += 512 + -(-size // 512) * 512
    out[at + 124 : at + 136] = b"77777777777\0"
    out[at + 148 : at + 156] = b" " * 8
    out[at + 148 : at + 156] = f"{sum(out[at : at + 512]):06o}\0 ".encode()
    return bytes(out)


def cli_export(
    s3: S3Location | None, source: str, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """``shardex export-dataset SOURCE ...``, with the S3 server's flags and keys if given."""
    environment, flags = env or {}, []
    if s3 is not None:
        keys = {"AWS_ACCESS_KEY_ID": s3.server.access_key}
        environment = {**keys, "AWS_SECRET_ACCESS_KEY": s3.server.secret_key, **environment}
        flags = ["--source-s3-endpoint-url", s3.server.endpoint]
        flags += ["--source-s3-region", s3.server.region]
    from click.testing import CliRunner

    from shardex.cli import main

    result = CliRunner().invoke(
        main,
        ["export-dataset", source, "-q", "--samples-per-shard", "5", *flags, *extra],
        env=environment,
    )
    return result.exit_code, result.output
