#!/usr/bin/env bash
# Packs the llama.cpp sources that the CUDA peer benchmark needs into
# build-peer/llamacpp-src.tar.gz (git-ignored), small enough for the device
# tool's 64 MiB carry (the llama-cpp-python sdist is ~77 MB: its models/ and
# docs/ alone are 113 MB unpacked). The GPU machine has no network, so it
# builds llama-bench from this tarball itself (scripts/gpu_run.sh, stage
# `peer_llamacpp`). Kept: CMake files, ggml (CPU and CUDA backends only),
# src, include, common, vendor, the llama-bench tool, and gguf-py for
# writing the benchmark model (scripts/hf_to_gguf_bf16.py).
# With --build it also builds llama-bench here (static, CUDA, sm_90a only;
# about an hour on 2 cores) into build-peer/llama-bench.xz, which the GPU
# machine then runs without building.
#   scripts/pack_llamacpp_peer.sh [--build] [version]   (env: LCPP_SDIST=/path/to.tar.gz)
set -euo pipefail
cd "$(dirname "$0")/.."
build=0
if [[ "${1:-}" == "--build" ]]; then build=1; shift; fi
version="${1:-0.3.36}"
work="${TMPDIR:-/tmp}/deepinfer_llamacpp_pack"
sdist="${LCPP_SDIST:-$work/llama_cpp_python-$version.tar.gz}"
mkdir -p "$work"
if [[ ! -f "$sdist" ]]; then
  python3 -m pip download "llama-cpp-python==$version" --no-deps --no-binary :all: --no-build-isolation -d "$work"
fi
rm -rf "$work/src" && mkdir -p "$work/src"
tar -C "$work/src" -xzf "$sdist"
src="$work/src/llama_cpp_python-$version/vendor/llama.cpp"
out="$work/llama.cpp"
rm -rf "$out" && mkdir -p "$out/ggml/src" "$out/tools"
cp -r "$src"/CMakeLists.txt "$src"/cmake "$src"/src "$src"/include "$src"/common "$src"/vendor "$src"/gguf-py \
  "$src"/LICENSE "$out/"
cp -r "$src"/ggml/CMakeLists.txt "$src"/ggml/cmake "$src"/ggml/include "$out/ggml/"
# ggml's own sources and the CPU and CUDA backends; the other backends are
# never configured (their options default to OFF).
find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$out/ggml/src/" \;
cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$out/ggml/src/"
cp -r "$src/tools/llama-bench" "$out/tools/"
printf 'llama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' > "$out/tools/CMakeLists.txt"
mkdir -p build-peer
tar -C "$work" -czf build-peer/llamacpp-src.tar.gz llama.cpp
echo "$version" > build-peer/LLAMACPP_VERSION
ls -la build-peer/llamacpp-src.tar.gz
if [[ $build == 1 ]]; then
  cmake -S "$out" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
  ninja -C "$out/build" llama-bench
  xz -T0 -c "$out/build/bin/llama-bench" > build-peer/llama-bench.xz
  mkdir -p build-peer/lib && cp -L "$(ldconfig -p | awk '/libgomp.so.1 /{print $NF; exit}')" build-peer/lib/
  ls -la build-peer/llama-bench.xz
fi
