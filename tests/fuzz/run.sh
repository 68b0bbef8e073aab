#!/usr/bin/env bash
# Builds every fuzz target (tests/fuzz/fuzz_<x>.cpp) with clang, libFuzzer,
# ASan and UBSan, then runs each for a bounded time on a scratch copy of its seed
# corpus (tests/fuzz/corpus/<x>/ or corpus/fuzz_<x>/, if present; a dictionary
# tests/fuzz/<x>.dict is used if present). Prints the executions per target and
# exits non-zero if any target fails to build, crashes, leaks or times out.
#
# Environment:
#   FUZZ_SECONDS=20          run time per target
#   FUZZ_TARGETS="gguf ..."  only these targets (default: all)
#   FUZZ_BUILD_DIR=build-fuzz
#   FUZZ_JOBS=$(nproc)       build parallelism
#   FUZZ_TIMEOUT=5           seconds one input may take
#   FUZZ_MAX_LEN=16384       longest input (deep nesting needs long inputs)
#   FUZZ_STACK_KB=1024       stack of the fuzzing process: small, so unbounded
#                            recursion on nested input overflows within max_len
# Besides the checked-in seeds, tests/fuzz/gen_seeds.py writes generated ones
# (deep nesting, huge counts, many keys) into each scratch corpus.
# Crash inputs are kept in $FUZZ_BUILD_DIR/artifacts/<x>/; replay one with
#   $FUZZ_BUILD_DIR/fuzz_<x> <file>
# Link a target against only the modules it needs with
# set(DEEPINFER_FUZZ_LIBS_<x> deepinfer_<module> ...) in CMakeLists.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
seconds="${FUZZ_SECONDS:-20}"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
timeout="${FUZZ_TIMEOUT:-5}"
max_len="${FUZZ_MAX_LEN:-16384}"
stack_kb="${FUZZ_STACK_KB:-1024}"
jobs="${FUZZ_JOBS:-$(nproc)}"

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (./build.sh installs it)" >&2; exit 1; }

targets=()
if [ -n "${FUZZ_TARGETS:-}" ]; then
  for t in $FUZZ_TARGETS; do targets+=("${t#fuzz_}"); done
else
  for f in tests/fuzz/fuzz_*.cpp; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .cpp)
    targets+=("${n#fuzz_}")
  done
fi
if ((${#targets[@]} == 0)); then
  echo "fuzz: no targets"
  exit 0
fi

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDEEPINFER_FUZZ=ON -DDEEPINFER_CUDA=OFF >/dev/null
fi
names=()
for t in "${targets[@]}"; do names+=("fuzz_$t"); done
# -k 0: a target that does not build must not stop the others from being fuzzed.
build_ok=1
cmake --build "$build" -j "$jobs" --target "${names[@]}" -- -k 0 || build_ok=0

work="$build/run"
rm -rf "$work"
mkdir -p "$work"
failed=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/fuzz_$t"
  if [ ! -x "$bin" ]; then
    summary+=("$(printf '%-20s %14s  %s' "$t" "-" "BUILD FAILED")")
    failed=1
    continue
  fi
  corpus="$work/corpus/$t"
  artifacts="$build/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  for seed in "tests/fuzz/corpus/$t" "tests/fuzz/corpus/fuzz_$t"; do
    if [ -d "$seed" ]; then cp -r "$seed"/. "$corpus"/; fi
  done
  python3 tests/fuzz/gen_seeds.py "$t" "$corpus" >/dev/null
  target_max_len="$max_len"
  # Model output is fed a piece at a time: long inputs cost much and add little.
  if [ "$t" = output_parser ] && [ -z "${FUZZ_MAX_LEN:-}" ]; then target_max_len=4096; fi
  # -malloc_limit_mb: one allocation sized by a forged count is a finding.
  args=(-max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 -malloc_limit_mb=1024
    -max_len="$target_max_len" -print_final_stats=1 -artifact_prefix="$artifacts/")
  if [ -f "tests/fuzz/$t.dict" ]; then args+=(-dict="tests/fuzz/$t.dict"); fi
  log="$work/$t.log"
  echo "fuzz: $t for ${seconds}s"
  rc=0
  (ulimit -s "$stack_kb" && exec "$bin" "${args[@]}" "$corpus") >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
  if [ "$rc" -eq 0 ]; then
    status="ok"
  else
    status="FAILED (exit $rc; log $log, inputs in $artifacts)"
    failed=1
    tail -n 40 "$log" >&2
  fi
  summary+=("$(printf '%-20s %14s  %s' "$t" "${execs:-?}" "$status")")
done

echo
printf '%-20s %14s  %s\n' "target" "executions" "result"
printf '%s\n' "${summary[@]}"
if ((build_ok == 0)); then failed=1; fi
exit "$failed"
