#!/usr/bin/env bash
# Install the project with its test dependencies and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k webdataset
source "$(dirname "$0")/env.sh"
install_extras "test"
cd "$ROOT"
# pytest exits 5 when no test ran: that is a failure here too (set -e keeps it non-zero).
python -m pytest "$@"
