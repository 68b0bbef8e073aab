#!/usr/bin/env bash
# Server tests: start the real `deepinfer serve` binary and drive it with the
# official openai and anthropic SDKs. Installs the Python packages if missing.
#   DEEPINFER_BIN=path/to/deepinfer tests/server/run.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
bin="${DEEPINFER_BIN:-$root/build/deepinfer}"
if [ ! -x "$bin" ]; then
  echo "server tests: $bin not found; build it first (./build.sh) or set DEEPINFER_BIN" >&2
  exit 1
fi
export DEEPINFER_BIN="$bin"
if ! python3 -c "import openai, anthropic, pytest, httpx, jsonschema" 2>/dev/null; then
  python3 -m pip install -q openai anthropic pytest httpx jsonschema
fi
if [ $# -eq 0 ]; then set -- .; fi
exec python3 -m pytest -q -p no:cacheprovider "$@"
