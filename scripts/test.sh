#!/usr/bin/env bash
# Install the project with its test dependencies and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k webdataset; scripts/test.sh --fast
# runs the fast tier (see tests/README.md).
source "$(dirname "$0")/env.sh"
# PyTorch, pinned: this version's CPU wheel is what the machines here install (an unpinned
# torch would pull a multi-GB CUDA build); it must come before anything depending on torch.
pip_install "torch==2.13.0"
install_extras "test,torch"
cd "$ROOT"
# Python's bytecode cache on, whatever the environment says: the processes the tests start
# (CLI runs, killed exports, Ray and DataLoader workers: hundreds) then load shardex
# compiled once, and pytest keeps its rewritten test modules between runs.
unset PYTHONDONTWRITEBYTECODE
# --fast: what no marker of s3, ray, browser, dali or slow sets (tests/README.md), in a
# few minutes; without it, everything. Both on two xdist workers (one per core here; the
# Ray tests share one worker, see tests/conftest.py); -n 0 as an argument runs in-process.
args=(-n "${SHARDEX_TEST_WORKERS:-2}" --dist loadgroup)
if [ "${1:-}" = "--fast" ]; then
  shift
  args+=(-m "not (s3 or ray or browser or dali or slow)")
fi
# pytest exits 5 when no test ran: that is a failure here too (set -e keeps it non-zero).
python -m pytest "${args[@]}" "$@"
