#!/usr/bin/env bash
# Tests of the Python package (deepinfer, built into build/python by ./build.sh)
# and of `deepinfer eval`.
set -euo pipefail
cd "$(dirname "$0")"
BUILD="${DEEPINFER_BUILD_DIR:-../../build}"
if [ ! -f "$BUILD"/python/deepinfer/__init__.py ] || ! ls "$BUILD"/python/deepinfer/_core*.so >/dev/null 2>&1; then
  echo "tests/python/run.sh: the Python module is missing from $BUILD/python; run ./build.sh" >&2
  exit 1
fi
if ! python3 -c "import pytest" 2>/dev/null; then python3 -m pip install -q pytest; fi
python3 -m pytest -q -p no:cacheprovider .
