"""Security: nothing on the read path unpickles, YAML is parsed safely, and credentials
never reach files, reprs or messages."""

from __future__ import annotations

import re
from pathlib import Path

import shardex
from shardex.storage import ObjectStorage
from tests.support.s3data import S3Location

SRC = Path(shardex.__file__).parent


def _python_sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py")}


def test_no_unpickling_and_only_safe_yaml() -> None:
    unsafe = {
        r"allow_pickle\s*=\s*True": "numpy arrays are loaded with allow_pickle=False",
        r"\bpickle\.loads?\(": "no pickle.load on the read path",
        r"yaml\.load\((?![^)]*Loader=_SafeLoader)": "yaml.load only with the safe loader",
        r"yaml\.unsafe_load": "no unsafe YAML",
        r"torch\.load\((?![^)]*weights_only=True)": "torch.load only with weights_only=True",
    }
    # The one unpickling allowed: export workers load the work their own Runner pickled
    # for them (what ProcessPoolExecutor does inside, made explicit so that work needing
    # the caller's __main__ falls back instead of breaking the pool). Nothing read from
    # storage goes through it.
    allowed = {("parallel.py", r"\bpickle\.loads?\(")}
    found = [
        f"{name}: {why}"
        for name, text in _python_sources().items()
        for pattern, why in unsafe.items()
        if re.search(pattern, text)
        and not name.startswith("testing/")
        and (name, pattern) not in allowed
    ]
    assert found == []
    assert len(re.findall(r"\bpickle\.loads?\(", _python_sources()["parallel.py"])) == 2


def test_credentials_never_reach_the_export_or_messages(s3: S3Location) -> None:
    secret = s3.server.secret_key
    shardex.export("demo:30", s3.url, storage_options=s3.direct, workers=1)
    storage = ObjectStorage(s3.url, s3.direct)
    for name in storage.list():
        if not name.endswith(".tar"):  # tars hold images; everything else is ours
            assert secret.encode() not in storage.get(name), name
    assert secret not in repr(storage)
    assert secret not in str(shardex.read_config(storage).to_dict())
