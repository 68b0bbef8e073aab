#!/usr/bin/env bash
# Runs every test: builds, then the C++ unit and op tests (CTest), the Python
# end-to-end checks against checked-in reference data, the HTTP server tests
# (real binary + openai/anthropic SDKs), the Python package, and short fuzz runs.
set -euo pipefail
cd "$(dirname "$0")"
./build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
# Server tests need build/deepinfer; run.sh fails loudly when it is missing.
tests/server/run.sh
# The Python package and `deepinfer eval` (needs build/python from build.sh).
tests/python/run.sh
if [ -x tests/fuzz/run.sh ]; then
  tests/fuzz/run.sh
fi
