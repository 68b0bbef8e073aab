#!/usr/bin/env bash
# Runs every test: builds, then the C++ unit and op tests (CTest), the Python
# end-to-end checks against checked-in reference data, and short fuzz runs.
set -euo pipefail
cd "$(dirname "$0")"
./build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
if [ -x tests/fuzz/run.sh ]; then
  tests/fuzz/run.sh
fi
