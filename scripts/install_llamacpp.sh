#!/usr/bin/env bash
# Installs llama-cpp-python from its PyPI sdist as a CPU build tuned for this
# machine. It is a developer tool for producing reference data and speed
# comparisons (scripts/gen_e2e_reference.py, scripts/bench_llamacpp.py); CI
# never needs it because tests read the checked-in data under tests/data/e2e/.
#
# The build must run here, not merely compile: CPUID may list AMX where the OS
# or hypervisor has not enabled its tile state, and on some machines ggml's AMX
# path crashes at the first matrix product (SIGILL or SIGSEGV). So the script
#   1. probes AMX by running one tile instruction (after asking the kernel for
#      the tile state) and leaves AMX out when that fails;
#   2. smoke-tests the installed library in a child process (load the default
#      model, generate 4 tokens) and, if it dies, rebuilds with every extension
#      named explicitly and AMX off, then tests again.
#
# Idempotent: does nothing when the requested version is installed and passes
# the smoke test.
#
# LCPP_ISA=avx2 LCPP_TARGET=DIR builds a second copy limited to AVX2/FMA/F16C
# into DIR (pip --target; use it with PYTHONPATH=DIR): the peer an AVX2-only
# server would run, for comparisons on a machine that has more.
# Usage: scripts/install_llamacpp.sh [version]   (env: LCPP_SDIST=/path/to.tar.gz, LCPP_ISA, LCPP_TARGET)
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-0.3.36}"
python="${PYTHON:-python3}"
model="models/SmolLM2-135M-Instruct.Q4_1.gguf"
isa_level="${LCPP_ISA:-native}"
target="${LCPP_TARGET:-}"
if [[ -n "$target" ]]; then
    mkdir -p "$target"
    target=$(cd "$target" && pwd)
    export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi

has_flag() { grep -qw "$1" /proc/cpuinfo; }

probe_amx() {  # success when a tile instruction runs here
    local dir rc
    dir=$(mktemp -d)
    cat > "$dir/amx.c" <<'C'
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config { unsigned char palette, start; unsigned char reserved[14]; unsigned short colsb[16]; unsigned char rows[16]; };
int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 1;
  struct tile_config c __attribute__((aligned(64))) = {0};
  c.palette = 1; c.rows[0] = 1; c.colsb[0] = 4;
  _tile_loadconfig(&c); _tile_zero(0); _tile_release();
  return 0;
}
C
    rc=1
    if ${CC:-cc} -mamx-tile -O0 -o "$dir/amx" "$dir/amx.c" 2>/dev/null; then
        "$dir/amx" 2>/dev/null && rc=0
    fi
    rm -rf "$dir"
    return $rc
}

# Every extension this CPU lists, named one by one, with AMX off.
explicit_no_amx() {
    local args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" f
    for f in avx:GGML_AVX avx2:GGML_AVX2 fma:GGML_FMA f16c:GGML_F16C bmi2:GGML_BMI2 avx512f:GGML_AVX512 \
             avx512vbmi:GGML_AVX512_VBMI avx512_vnni:GGML_AVX512_VNNI avx512_bf16:GGML_AVX512_BF16 \
             avx_vnni:GGML_AVX_VNNI; do
        if has_flag "${f%%:*}"; then args+=" -D${f#*:}=ON"; else args+=" -D${f#*:}=OFF"; fi
    done
    echo "$args"
}

# The installed library loads a model and generates, in a child process.
smoke_test() {
    "$python" -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.__version__ == '$version' else 1)" 2>/dev/null || return 1
    [ -f "$model" ] || { echo "install_llamacpp.sh: $model missing (./build.sh fetches it); import checked only"; return 0; }
    "$python" - "$model" <<'PY'
import sys
import llama_cpp
m = llama_cpp.Llama(sys.argv[1], n_ctx=128, n_threads=2, verbose=False)
out = m("The capital of France is", max_tokens=4, temperature=0)
print("llama.cpp smoke test:", repr(out["choices"][0]["text"]))
PY
}

# AVX2, FMA, F16C and BMI2 only: what an AVX2-only machine runs.
avx2_only() {
    echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
 -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF \
 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}

build() {  # build ISA_ARGS
    # Building from source on a shared 2-core box: no networking, no
    # multimodal library, server or examples, two compile jobs.
    export CMAKE_ARGS="$1 -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF ${CMAKE_ARGS_EXTRA:-}"
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
    export FORCE_CMAKE=1
    echo "building llama-cpp-python $version with: $1"
    local sdist="${LCPP_SDIST:-}"
    if [[ -z "$sdist" ]]; then
        local cached="/tmp/pk/lcpp/llama_cpp_python-${version}.tar.gz"
        [[ -f "$cached" ]] && sdist="$cached"
    fi
    # The build tools, and the runtime dependencies that --no-deps below skips.
    "$python" -m pip install --upgrade --quiet scikit-build-core cmake ninja numpy diskcache jinja2 typing-extensions
    local where=()
    [[ -n "$target" ]] && where=(--target "$target" --upgrade)
    "$python" -m pip install --force-reinstall --no-deps --no-binary llama-cpp-python --no-cache-dir --quiet \
        "${where[@]}" "${sdist:-llama-cpp-python==$version}"
}

# (With LCPP_TARGET only a copy inside the target counts, not the system one.)
if [[ -z "$target" || -d "$target/llama_cpp" ]] && smoke_test; then
    echo "llama-cpp-python $version already installed and working"
    exit 0
fi
if [[ "$isa_level" == avx2 ]]; then
    build "$(avx2_only)"
    smoke_test || { echo "install_llamacpp.sh: the AVX2 build does not run here" >&2; exit 1; }
    "$python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed:', llama_cpp.llama_print_system_info().decode())"
    exit 0
fi
[[ "$isa_level" == native ]] || { echo "install_llamacpp.sh: LCPP_ISA must be native or avx2" >&2; exit 1; }
isa="-DGGML_NATIVE=ON"
if has_flag amx_tile && ! probe_amx; then
    echo "install_llamacpp.sh: the CPU lists AMX but a tile instruction does not run here"
    isa=$(explicit_no_amx)
fi
build "$isa"
if ! smoke_test; then
    [ "$isa" = "-DGGML_NATIVE=ON" ] || { echo "install_llamacpp.sh: the build does not run here" >&2; exit 1; }
    echo "install_llamacpp.sh: the native build crashed; rebuilding with AMX off"
    build "$(explicit_no_amx)"
    smoke_test || { echo "install_llamacpp.sh: the build does not run here" >&2; exit 1; }
fi
"$python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'installed:', llama_cpp.llama_print_system_info().decode())"
