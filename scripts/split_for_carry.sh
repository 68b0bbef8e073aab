#!/usr/bin/env bash
# Splits a file larger than the device tool's 64 MiB carry into parts in
# build-gguf/ (git-ignored), next to the pure-Python gguf wheel the e2e check
# reads GGUF files with (the GPU machine has no network), to be carried one
# per call to a warm GPU machine
# (carry ["build-gguf/<name>.part_aa", "build-gguf/gguf-<version>.whl"], then
# ["build-gguf/<name>.part_ab"], ...;
# files carried earlier stay there while the machine is warm; 27 MiB parts
# leave room for the ~25 MB working tree in each call, and SmolLM2's last
# part (13 MB) fits beside build-gpu/ (15 MB) in the call that brings the
# binaries). The e2e and spec stages
# of scripts/gpu_run.sh put them together again:
#   scripts/split_for_carry.sh models/SmolLM2-135M-Instruct.Q4_1.gguf
#   E2E_MODELS= E2E_GGUF=build-gguf/SmolLM2-135M-Instruct.Q4_1.gguf bash scripts/gpu_run.sh e2e
set -euo pipefail
cd "$(dirname "$0")/.."
file="${1:?usage: scripts/split_for_carry.sh FILE}"
mkdir -p build-gguf
split -b 27M "$file" "build-gguf/$(basename "$file").part_"
ls build-gguf/gguf-*.whl >/dev/null 2>&1 || python3 -m pip download -q --no-deps --only-binary :all: -d build-gguf gguf
ls -la build-gguf
