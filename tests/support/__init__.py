"""Test support for shardex's own tests and benchmarks (not shipped in the wheel).

A real S3-compatible server (:mod:`tests.support.seaweedfs`), a request-counting,
fault-injecting proxy in front of it (:mod:`tests.support.proxy`, both re-exported by
:mod:`tests.support.s3`), a loopback-only local Ray cluster (:mod:`tests.support.raycluster`),
small pipeline stages (:mod:`tests.support.stages`) and the stock webdataset reader
(:mod:`tests.support.interop`). Import them as ``tests.support.*`` with the repository root on ``sys.path``: pytest puts it there (``pythonpath`` in
pyproject.toml), the benchmarks through ``benchmarks/_report.py``. Third-party conformance
suites stay in :mod:`shardex.testing`.
"""
