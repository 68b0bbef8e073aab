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

# `pip install .` works: build the package into a throwaway virtual environment
# (CPU backend only, to keep the build short) and generate with it from
# outside the source tree.
root=$(cd ../.. && pwd)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$root" -C cmake.define.DEEPINFER_CUDA=OFF
(cd "$venv" && DEEPINFER_HF_MODEL_DIR="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$venv/bin/python" - <<'PY'
import deepinfer
assert deepinfer.__file__.startswith(__import__("sys").prefix), deepinfer.__file__
out = deepinfer.LLM().generate("The capital of France is", deepinfer.SamplingParams(temperature=0, max_tokens=8))[0]
assert out.finished and len(out.outputs[0].token_ids) > 0, out
print("pip install . works:", repr(out.outputs[0].text))
PY
)
