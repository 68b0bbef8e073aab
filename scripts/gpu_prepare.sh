#!/usr/bin/env bash
# Builds the CUDA-enabled binaries on this (CPU-only) machine and stages them
# with the shared libraries they need into build-gpu/ (ignored by git), so
# that the device `run` tool can carry them to a GPU machine whose image has
# CUDA but not our C++ dependencies (fmt, OpenBLAS, PCRE2, GoogleTest, ...).
# scripts/gpu_run.sh uses build-gpu/ when it is present and builds otherwise.
#   BUILD_DIR=/tmp/build-cuda scripts/gpu_prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-/tmp/build-cuda}"
JOBS="${JOBS:-2}"
# Executables to build and stage (deepinfer is the CLI target deepinfer_cli).
EXES="${EXES:-test_ops deepinfer bench_gemv_cuda}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_CUDA=ON -DDEEPINFER_PYTHON=OFF >/dev/null
# SKIP_BUILD=1 stages the binaries as they are (e.g. built from an earlier commit while the tree moved on).
[ "${SKIP_BUILD:-0}" = 1 ] || ninja -C "$BUILD_DIR" -j "$JOBS" $(echo "$EXES" | sed 's/\bdeepinfer\b/deepinfer_cli/')
rm -rf build-gpu
mkdir -p build-gpu/bin build-gpu/lib
for exe in $EXES; do
  strip --strip-debug -o "build-gpu/bin/$exe" "$BUILD_DIR/$exe"
  # Everything but the C library, the driver and the CUDA toolkit's own
  # libraries and NCCL (those come from the GPU machine: NCCL from PyTorch's
  # wheels, which scripts/gpu_run.sh puts on the library path).
  ldd "$BUILD_DIR/$exe" | awk '/=> \//{print $3}' |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudart|libnccl)\.so' |
    while read -r lib; do cp -Ln "$lib" build-gpu/lib/ 2>/dev/null || true; done
done
# Compressed (xz: the device tool carries at most 64 MiB with the working tree).
XZ_OPT=-9 tar -C build-gpu -cJf build-gpu/lib.tar.xz lib && rm -rf build-gpu/lib
XZ_OPT=-9 tar -C build-gpu -cJf build-gpu/bin.tar.xz bin && rm -rf build-gpu/bin
git rev-parse HEAD > build-gpu/COMMIT
[ "${SKIP_BUILD:-0}" = 1 ] && echo "${STAGED_COMMIT:-unknown}" > build-gpu/COMMIT
git status --short -- src tests tools CMakeLists.txt > build-gpu/DIRTY || true
du -sh build-gpu build-gpu/*
