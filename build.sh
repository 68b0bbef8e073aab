#!/usr/bin/env bash
# Installs what is missing (Debian packages, the default model), configures and
# builds into build/. Idempotent: a second run with nothing changed takes seconds.
#   ./build.sh            release build (RelWithDebInfo)
#   BUILD_DIR=... ./build.sh   another build folder
set -euo pipefail
cd "$(dirname "$0")"
BUILD_DIR="${BUILD_DIR:-build}"

apt_packages=(cmake ninja-build ccache g++ pkg-config xz-utils unzip python3-pip
  libopenblas-dev nlohmann-json3-dev libfmt-dev libxxhash-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libcli11-dev clang libclang-rt-14-dev libboost1.81-dev
  etcd-server libucx-dev libgloo-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "build.sh: installing ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

scripts/fetch_models.sh
scripts/fetch_xgrammar.sh
scripts/fetch_eval_data.sh
# nanobind builds the Python module (build/python/deepinfer; `pip install .` for an install).
if ! python3 -c "import nanobind" 2>/dev/null; then
  python3 -m pip install -q "nanobind>=2.0"
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
