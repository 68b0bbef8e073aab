#!/usr/bin/env bash
# Installs llama-cpp-python from its PyPI sdist as a CPU build tuned for this
# machine. It is a developer tool for producing reference data and speed
# comparisons (scripts/gen_e2e_reference.py, scripts/bench_llamacpp.py); CI
# never needs it because tests read the checked-in data under tests/data/e2e/.
#
# Idempotent: does nothing when the requested version is already importable.
# Usage: scripts/install_llamacpp.sh [version]   (env: LCPP_SDIST=/path/to.tar.gz)
set -euo pipefail

version="${1:-0.3.36}"
python="${PYTHON:-python3}"

if "$python" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$version' else 1)" 2>/dev/null; then
    echo "llama-cpp-python $version already installed"
    exit 0
fi

# Building from source on a shared 2-core box: native ISA, no networking,
# no multimodal library, server or examples, two compile jobs.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export FORCE_CMAKE=1

sdist="${LCPP_SDIST:-}"
if [[ -z "$sdist" ]]; then
    cached="/tmp/pk/lcpp/llama_cpp_python-${version}.tar.gz"
    [[ -f "$cached" ]] && sdist="$cached"
fi

"$python" -m pip install --upgrade --quiet scikit-build-core cmake ninja numpy
if [[ -n "$sdist" ]]; then
    echo "building llama-cpp-python from $sdist"
    "$python" -m pip install --no-binary llama-cpp-python --no-cache-dir --verbose "$sdist"
else
    echo "downloading and building llama-cpp-python==$version from PyPI"
    "$python" -m pip install --no-binary llama-cpp-python --no-cache-dir --verbose "llama-cpp-python==$version"
fi
"$python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed')"
