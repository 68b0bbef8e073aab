#!/usr/bin/env bash
# Stages the libFuzzer targets for a long run on another machine (the device
# machine's 16 cores, through the `run` tool): builds them as tests/fuzz/run.sh
# does, then packs the binaries, the shared libraries they need, and each
# target's starting corpus (checked-in seeds + tests/fuzz/gen_seeds.py) and
# dictionary into fuzz-stage/ (ignored by git). scripts/fuzz_nightly.sh runs it.
#   FUZZ_BUILD_DIR=build-fuzz scripts/fuzz_stage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build="${FUZZ_BUILD_DIR:-build-fuzz}"
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDEEPINFER_FUZZ=ON -DDEEPINFER_CUDA=OFF >/dev/null
fi
targets=()
for f in tests/fuzz/fuzz_*.cpp; do n=$(basename "$f" .cpp); targets+=("${n#fuzz_}"); done
cmake --build "$build" -j "${FUZZ_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"
rm -rf fuzz-stage
mkdir -p fuzz-stage/bin fuzz-stage/lib fuzz-stage/corpus fuzz-stage/dict
for t in "${targets[@]}"; do
  strip --strip-debug -o "fuzz-stage/bin/fuzz_$t" "$build/fuzz_$t"
  ldd "$build/fuzz_$t" | awk '/=> \//{print $3}' |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -Ln "$lib" fuzz-stage/lib/ 2>/dev/null || true; done
  mkdir -p "fuzz-stage/corpus/$t"
  for seed in "tests/fuzz/corpus/$t" "tests/fuzz/corpus/fuzz_$t"; do
    if [ -d "$seed" ]; then cp -r "$seed"/. "fuzz-stage/corpus/$t"/; fi
  done
  python3 tests/fuzz/gen_seeds.py "$t" "fuzz-stage/corpus/$t" >/dev/null
  if [ -f "tests/fuzz/$t.dict" ]; then cp "tests/fuzz/$t.dict" fuzz-stage/dict/; fi
done
# fuzz_tokenizer_encode loads a real tokenizer from ../shared (next to the repository).
mkdir -p fuzz-stage/shared/tokenizers/qwen3
cp ../shared/tokenizers/qwen3/tokenizer.json.xz fuzz-stage/shared/tokenizers/qwen3/
git rev-parse HEAD > fuzz-stage/COMMIT
git status --short -- src tests CMakeLists.txt > fuzz-stage/DIRTY || true
tar -C fuzz-stage -czf fuzz-stage/stage.tar.gz bin lib corpus dict shared &&
  rm -rf fuzz-stage/bin fuzz-stage/lib fuzz-stage/corpus fuzz-stage/dict fuzz-stage/shared
du -sh fuzz-stage/stage.tar.gz
