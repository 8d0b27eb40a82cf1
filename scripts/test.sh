#!/usr/bin/env bash
# Install the project with its test dependencies and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k webdataset
source "$(dirname "$0")/env.sh"
# PyTorch, pinned: this version's CPU wheel is what the machines here install (an unpinned
# torch would pull a multi-GB CUDA build); it must come before anything depending on torch.
pip_install "torch==2.13.0"
install_extras "test,torch"
cd "$ROOT"
# pytest exits 5 when no test ran: that is a failure here too (set -e keeps it non-zero).
python -m pytest "$@"
