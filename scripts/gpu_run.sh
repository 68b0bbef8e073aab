#!/usr/bin/env bash
# One command for the GPU machine (device `run` tool), from the repository root:
#   scripts/gpu_run.sh [stages]     stages: any of build,probe,test,dist,e2e,bench,fp8,tput,kvtiers,disagg,bi,decode_ab,pdl,moe,kernels,mtp,spec,structured,sweep,eval,profile,peer_llamacpp
#                                   (default: build,test,e2e,bench)
# Uses the binaries staged in build-gpu/ by scripts/gpu_prepare.sh when present
# (pass carry=["build-gpu"]); otherwise configures and builds with CUDA here
# (needs the C++ dependencies that build.sh installs). Then runs the op tests
# (CUDA vs the CPU reference), scripts/gpu_e2e.py (vs transformers) and
# scripts/gpu_bench.py, and writes report.md plus the JSON/logs into $OUT
# (at most 7 files: the device tool brings back 8).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/deepinfer_gpu_out}"
mkdir -p "$OUT"
STAGES="${1:-build,test,e2e,bench}"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1
REPORT="$OUT/report.md"
{
  echo "# DeepInfer GPU run"
  echo
  echo "- date: $(date -u +%FT%TZ)"
  echo "- commit: $(cat build-gpu/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "- gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1)"
} > "$REPORT"

# libcublas from the CUDA toolkit or from PyTorch's wheels.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH

BIN=""
# Python's tarfile reads xz whether or not the image has the xz tool.
untar() { python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }
[ -f build-gpu/bin.tar.xz ] && untar build-gpu/bin.tar.xz build-gpu
if [ -x build-gpu/bin/deepinfer ]; then
  mkdir -p /tmp/deepinfer_libs && untar build-gpu/lib.tar.xz /tmp/deepinfer_libs
  export LD_LIBRARY_PATH="/tmp/deepinfer_libs/lib:$LD_LIBRARY_PATH"
  if build-gpu/bin/deepinfer --help >/dev/null 2>/tmp/prebuilt_check.log; then
    BIN=build-gpu/bin
    echo "- binaries: prebuilt by scripts/gpu_prepare.sh (build-gpu/)" >> "$REPORT"
  else
    echo "- prebuilt binaries do not run here: $(head -c 300 /tmp/prebuilt_check.log)" >> "$REPORT"
  fi
fi
if [ -z "$BIN" ] && has build; then
  t0=$(date +%s)
  if cmake -S . -B build-gpu-src -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON > "$OUT/build.log" 2>&1 &&
     ninja -C build-gpu-src -j16 test_ops deepinfer_cli >> "$OUT/build.log" 2>&1; then
    BIN=build-gpu-src
    echo "- binaries: built here in $(( $(date +%s) - t0 )) s" >> "$REPORT"
  else
    echo "- build FAILED (tail of build.log below)" >> "$REPORT"
    tail -30 "$OUT/build.log" | sed 's/^/    /' >> "$REPORT"
  fi
fi
# The llama.cpp peer alone needs none of our binaries (carry build-peer only: both do not fit in one call).
[ -n "$BIN" ] || [ "$STAGES" = peer_llamacpp ] || { cat "$REPORT"; exit 1; }

# The Llama-3-8B-shaped random model, created (not compared) unless there.
make_llama8b() {
  [ -f /tmp/deepinfer_e2e/llama8b/config.json ] || timeout 300 python3 -c "import sys; sys.path.insert(0, 'scripts'); \
import gpu_e2e; gpu_e2e.build_model('llama8b', '/tmp/deepinfer_e2e/llama8b')" > "$OUT/e2e_llama8b.log" 2>&1
}

if has probe; then
  # Kernel-level questions: the gemv partitions per projection shape, and
  # per-kernel device times of batch-1 decode steps on a small model (whose
  # step time is all per-kernel overhead) and on the 8B shape.
  echo -e "\n## Probe: gemv partitions (bench_gemv_cuda)\n" >> "$REPORT"
  if [ -x "$BIN/bench_gemv_cuda" ]; then
    timeout 120 "$BIN/bench_gemv_cuda" 30 > "$OUT/gemv.txt" 2>&1; echo "exit code $?" >> "$REPORT"
    cat "$OUT/gemv.txt" >> "$REPORT"
  fi
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for m in ${PROBE_MODELS:-qwen3}; do
    [ -f /tmp/deepinfer_e2e/$m/config.json ] || timeout 200 python3 scripts/gpu_e2e.py --deepinfer "$BIN/deepinfer" \
      --out /tmp --models $m --keep $m > "$OUT/e2e_probe_$m.log" 2>&1
    echo -e "\n## Probe: kernel times, $m, 32-token prompt + 5 decode steps (ncu)\n" >> "$REPORT"
    timeout "${PROFILE_TIMEOUT:-150}" "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      --print-summary per-kernel "$BIN/deepinfer" generate --device cuda --model /tmp/deepinfer_e2e/$m \
      --prompt "$(printf 'a%.0s' $(seq 32))" -n 6 --max-model-len 4096 --kv-cache-memory 2147483648 \
      > "$OUT/ncu_$m.txt" 2>&1
    echo "exit code $? (summary in ncu_$m.txt)" >> "$REPORT"
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration.sum" "$OUT/ncu_$m.txt" | paste - - | \
      awk '{print}' | head -60 | sed 's/^/    /' >> "$REPORT"
  done
  if [ -n "${PROBE_PREFILL:-}" ] && [ -f /tmp/deepinfer_e2e/llama8b/config.json ]; then
    echo -e "\n## Probe: kernel times, llama8b, one 8,192-token prefill (ncu)\n" >> "$REPORT"
    timeout "${PROFILE_TIMEOUT:-150}" "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      --print-summary per-kernel "$BIN/deepinfer" generate --device cuda --model /tmp/deepinfer_e2e/llama8b \
      --prompt "$(head -c 8192 /dev/zero | tr '\0' 'a')" -n 1 --max-model-len 8300 --max-num-batched-tokens 8192 \
      --kv-cache-memory 4294967296 > "$OUT/ncu_prefill.txt" 2>&1
    echo "exit code $? (summary in ncu_prefill.txt)" >> "$REPORT"
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration.sum" "$OUT/ncu_prefill.txt" | paste - - | head -60 | sed 's/^/    /' >> "$REPORT"
  fi
fi
if has test; then
  echo -e "\n## Op tests (CUDA vs CPU reference)\n" >> "$REPORT"
  timeout 180 "$BIN/test_ops" --gtest_brief=1 --gtest_output=json:/tmp/test_ops.json > "$OUT/test_ops.log" 2>&1
  rc=$?
  echo "exit code $rc; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_ops.log" | tr '\n' ' ')" >> "$REPORT"
  grep -E '^\[  FAILED  \]|Failure|error ratio|Expected' "$OUT/test_ops.log" | head -40 | sed 's/^/    /' >> "$REPORT"
  # Model-level CUDA tests (CUDA vs CPU logits on the tiny models), when staged.
  for t in test_mla_models test_moe_models test_engine; do
    [ -x "$BIN/$t" ] || continue
    timeout 120 "$BIN/$t" --gtest_brief=1 --gtest_filter='*Cuda*' > "$OUT/$t.log" 2>&1
    echo "$t (CUDA cases): exit code $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')" >> "$REPORT"
    grep -E '^\[  FAILED  \]|Failure|max|diff' "$OUT/$t.log" | head -20 | sed 's/^/    /' >> "$REPORT"
  done
fi
if has dist; then
  # The communicators: NCCL with one rank (every collective, a captured
  # graph), and the Gloo tests on this machine's cores.
  echo -e "\n## Distributed (test_dist)\n" >> "$REPORT"
  timeout 120 "$BIN/test_dist" --gtest_brief=1 > "$OUT/test_dist.log" 2>&1
  echo "test_dist: exit code $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_dist.log" | tr '\n' ' ')" >> "$REPORT"
  grep -E '^\[  FAILED  \]|Failure|NcclOneRank' "$OUT/test_dist.log" | head -20 | sed 's/^/    /' >> "$REPORT"
  "$BIN/test_dist" --gtest_filter='NcclOneRank*' 2>&1 | grep -E '^\[ +(OK|SKIPPED|FAILED) ' | sed 's/^/    /' >> "$REPORT"
  # Expert parallelism's device path over a one-rank NCCL group, against the
  # plain MoE layer (stage test_tensor_parallel with gpu_prepare.sh's EXES).
  if [ -x "$BIN/test_tensor_parallel" ]; then
    timeout 120 "$BIN/test_tensor_parallel" --gtest_filter='ExpertParallelOneRank*' > "$OUT/test_ep.log" 2>&1
    echo "ExpertParallelOneRank: exit code $?" >> "$REPORT"
    grep -E '^\[ +(OK|SKIPPED|FAILED) |Failure|difference' "$OUT/test_ep.log" | head -20 | sed 's/^/    /' >> "$REPORT"
  fi
fi
if has e2e; then
  echo -e "\n## End-to-end vs transformers\n" >> "$REPORT"
  # GGUF checkpoints with real weights (E2E_GGUF=a.gguf,b.gguf): a file
  # larger than one carry arrives in parts over several calls to a warm
  # machine (scripts/split_for_carry.sh puts them in build-gguf/, git-ignored)
  # and is put together here, afresh each time: an earlier call may have
  # joined only the parts that had arrived by then.
  for w in build-gguf/gguf-*.whl; do [ -f "$w" ] && export PYTHONPATH="$PWD/$w${PYTHONPATH:+:$PYTHONPATH}"; done
  for first in build-gguf/*.part_aa; do
    [ -f "$first" ] || continue
    cat "${first%aa}"* > "build-gguf/$(basename "$first" .part_aa)"
  done
  timeout "${E2E_TIMEOUT:-420}" python3 scripts/gpu_e2e.py --deepinfer "$BIN/deepinfer" --out "$OUT" \
    ${E2E_MODELS+--models "$E2E_MODELS"} ${E2E_KV:+--kv-cache-dtypes $E2E_KV} \
    ${E2E_QUANT:+--quantizations $E2E_QUANT} ${E2E_GGUF:+--gguf $E2E_GGUF} \
    > "$OUT/e2e.log" 2>&1
  echo "exit code $?" >> "$REPORT"
  [ -f /tmp/deepinfer_e2e/e2e.md ] && cat /tmp/deepinfer_e2e/e2e.md >> "$REPORT"
  grep '^\[e2e\]' "$OUT/e2e.log" | sed 's/^/    /' >> "$REPORT"
fi
if has bench; then
  echo -e "\n## Benchmarks\n" >> "$REPORT"
  if [ ! -f /tmp/deepinfer_e2e/llama8b/config.json ]; then
    # A fresh machine: make the Llama-3-8B-shaped model (and check it) first.
    timeout 300 python3 scripts/gpu_e2e.py --deepinfer "$BIN/deepinfer" --out /tmp --models llama8b \
      > "$OUT/e2e_llama8b.log" 2>&1
    grep '^\[e2e\]' "$OUT/e2e_llama8b.log" | sed 's/^/    /' >> "$REPORT"
  fi
  if [ -f /tmp/deepinfer_e2e/llama8b/config.json ]; then
    timeout "${BENCH_TIMEOUT:-600}" python3 scripts/gpu_bench.py --deepinfer "$BIN/deepinfer" \
      --model /tmp/deepinfer_e2e/llama8b --out "$OUT" ${BENCH_ARGS:-} \
      $( [ -f /tmp/deepinfer_e2e/qwen3/config.json ] && echo --small-model /tmp/deepinfer_e2e/qwen3 ) \
      > "$OUT/bench.log" 2>&1
    echo "exit code $?" >> "$REPORT"
    [ -f /tmp/deepinfer_bench/bench.md ] && cat /tmp/deepinfer_bench/bench.md >> "$REPORT"
    grep '^\[bench\]' "$OUT/bench.log" | sed 's/^/    /' >> "$REPORT"
  else
    echo "could not create the Llama-3-8B-shaped model (see e2e_llama8b.log)" >> "$REPORT"
  fi
fi
if has decode_ab; then
  # Batch-1 decode of the 8B shape under each environment of DECODE_AB
  # (space-separated VAR=VALUE settings, ',' joining several in one variant),
  # in alternation, to compare kernel options in the same run.
  echo -e "\n## Batch-1 decode A/B (llama8b, ${DECODE_AB_REPS:-3} runs each, alternating)\n" >> "$REPORT"
  make_llama8b
  for round in 1 2; do
    for variant in ${DECODE_AB:-DEEPINFER_PDL=0 DEEPINFER_PDL=1}; do
      tag=$(echo "$variant" | tr ',=' '_-')
      env $(echo "$variant" | tr ',' ' ') timeout 300 python3 scripts/gpu_bench.py --deepinfer "$BIN/deepinfer" \
        --model /tmp/deepinfer_e2e/llama8b --out /tmp --workdir /tmp/deepinfer_ab_$tag \
        --skip peer,batch,prefill,pipeline,small --reps "${DECODE_AB_REPS:-3}" > "/tmp/ab_${tag}_$round.log" 2>&1
      echo "- round $round, $variant: $(grep 'batch-1 decode' /tmp/ab_${tag}_$round.log | sed 's/^\[bench\] //')" >> "$REPORT"
    done
  done
fi
if has peer_llamacpp; then
  # llama.cpp with CUDA as a speed peer: built here from the sources that
  # scripts/pack_llamacpp_peer.sh packs (carry build-peer; this machine has no
  # network), run by llama-bench on a bf16 GGUF of the 8B-shaped model
  # (scripts/hf_to_gguf_bf16.py: timing only, placeholder vocabulary). Batch-1
  # generation of 256 tokens after 128 of context, as our decode figure.
  echo -e "\n## Peer: llama.cpp (CUDA, bf16), llama-bench tg256 at depth 128\n" >> "$REPORT"
  LC=/tmp/llamacpp
  if [ ! -f build-peer/llamacpp-src.tar.gz ]; then
    echo "build-peer/llamacpp-src.tar.gz missing: run scripts/pack_llamacpp_peer.sh and carry build-peer" >> "$REPORT"
  else
    rm -rf /tmp/llama.cpp && tar -C /tmp -xzf build-peer/llamacpp-src.tar.gz  # gguf-py for the converter
    if [ -f build-peer/llama-bench.xz ] && [ ! -x $LC/build/bin/llama-bench ]; then
      # Built on the dev machine (scripts/pack_llamacpp_peer.sh --build: static, CUDA, sm_90a),
      # which saves the GPU machine's time.
      # build-peer/lib: the OpenMP runtime it links, in case this image lacks it (searched last).
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/build-peer/lib"
      mkdir -p $LC/build/bin && mv /tmp/llama.cpp/gguf-py $LC/ && xz -dc build-peer/llama-bench.xz > $LC/build/bin/llama-bench &&
        chmod +x $LC/build/bin/llama-bench && echo "- llama-bench prebuilt on the dev machine ($(cat build-peer/LLAMACPP_VERSION))" >> "$REPORT"
    fi
    if [ ! -x $LC/build/bin/llama-bench ]; then
      rm -rf $LC && mv /tmp/llama.cpp $LC
      t0=$(date +%s)
      GEN=$(command -v ninja >/dev/null && echo "-G Ninja")
      cmake -S $LC -B $LC/build $GEN -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > "$OUT/llamacpp_build.log" 2>&1 &&
        timeout "${PEER_BUILD_TIMEOUT:-480}" cmake --build $LC/build --target llama-bench -j "$(nproc)" \
        >> "$OUT/llamacpp_build.log" 2>&1
      echo "build exit code $? in $(( $(date +%s) - t0 )) s (llamacpp_build.log)" >> "$REPORT"
    fi
    M=/tmp/deepinfer_e2e/llama8b GGUF=/tmp/llama8b-bf16.gguf
    make_llama8b
    [ -f $GGUF ] || timeout 300 python3 scripts/hf_to_gguf_bf16.py $M $GGUF --gguf-py $LC/gguf-py \
      >> "$OUT/llamacpp_build.log" 2>&1
    if [ -x $LC/build/bin/llama-bench ] && [ -f $GGUF ]; then
      timeout "${PEER_TIMEOUT:-240}" $LC/build/bin/llama-bench -m $GGUF -ngl 99 -p 0 -n 256 -d 128 -r 3 -o md \
        > "$OUT/llamacpp_bench.md" 2> "$OUT/llamacpp_bench.log"
      echo "exit code $?" >> "$REPORT"
      cat "$OUT/llamacpp_bench.md" >> "$REPORT"
    else
      echo "no llama-bench or no GGUF (see llamacpp_build.log)" >> "$REPORT"
      tail -20 "$OUT/llamacpp_build.log" | sed 's/^/    /' >> "$REPORT"
    fi
  fi
fi
if has profile && [ -f /tmp/deepinfer_e2e/llama8b/config.json ]; then
  # Per-kernel GPU time of a short run (prefill of 64 tokens + 3 decode steps).
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo -e "\n## Kernel times (ncu, llama8b, 64-token prompt + 3 decode steps)\n" >> "$REPORT"
  # PROFILE_ARGS: more flags for the run (e.g. --quantization fp8, with DEEPINFER_CUDA_FP8=1 set).
  timeout "${PROFILE_TIMEOUT:-150}" "$NCU" --clock-control none --metrics gpu__time_duration.sum \
    --print-summary per-kernel "$BIN/deepinfer" generate --device cuda --model /tmp/deepinfer_e2e/llama8b \
    --prompt "$(printf 'a%.0s' $(seq 64))" -n 4 --kv-cache-memory 4294967296 ${PROFILE_ARGS:-} > "$OUT/ncu.txt" 2>&1
  echo "exit code $? (full summary in ncu.txt)" >> "$REPORT"
  grep -E "^  [a-zA-Z_].*\(|gpu__time_duration.sum" "$OUT/ncu.txt" | paste - - | head -40 | cut -c1-220 | sed 's/^/    /' >> "$REPORT"
fi
if has pdl && [ -f /tmp/deepinfer_e2e/llama8b/config.json ]; then
  # Programmatic dependent launch on and off, alternating, same process
  # settings: decode ms/token of the 8B shape at batch 1 and 32.
  echo -e "\n## Decode with programmatic dependent launch on/off (DEEPINFER_PDL)\n" >> "$REPORT"
  for round in 1 2; do
    for pdl in 1 0; do
      DEEPINFER_PDL=$pdl timeout 120 "$BIN/deepinfer" bench --device cuda --model /tmp/deepinfer_e2e/llama8b \
        -b 1,32 -p 128 -g 256 -r 1 --json --max-model-len 512 2>/dev/null |
        python3 -c 'import json,sys; print(" ".join("b%d: %.3f ms/step" % (p["batch"], 1000 * p["batch"] / p["decode_tok_s"]) for p in json.load(sys.stdin)))' |
        sed "s/^/    round $round PDL=$pdl: /" >> "$REPORT"
    done
  done
fi
if has fp8 && [ -n "$BIN" ]; then
  # FP8 row-block weights (docs/quantization.md): the CUDA FP8 cases of the
  # op tests, then batch-1 / batch-4 / batch-32 decode of the 8B shape with
  # bf16 weights and with --quantization fp8, alternating.
  echo -e "\n## FP8 weights (--quantization fp8, DEEPINFER_CUDA_FP8=1)\n" >> "$REPORT"
  timeout 300 "$BIN/test_ops" --gtest_filter='CudaBf16Test.Linear:CudaBf16Test.Fp8*' > "$OUT/fp8_ops.log" 2>&1
  echo "    op tests CudaBf16Test.Linear, .Fp8*: exit $? ($(grep -c '^\[       OK' "$OUT/fp8_ops.log") ok)" >> "$REPORT"
  grep -m3 -A3 'Failure' "$OUT/fp8_ops.log" | sed 's/^/    /' >> "$REPORT"
  if [ -x "$BIN/bench_gemv_cuda" ] && [ "${FP8_BENCH:-1}" != 0 ]; then
    timeout 150 "$BIN/bench_gemv_cuda" 20 > "$OUT/gemv.txt" 2>&1
    echo "    bench_gemv_cuda: exit $?" >> "$REPORT"
    sed -n '/^FP8/,$p' "$OUT/gemv.txt" | sed 's/^/    /' >> "$REPORT"
  fi
  # FP8_NCU=1: Nsight Compute on single launches (bench_gemv_cuda profile):
  # the FP8 kernels (register and shared-memory) and the bf16 gemv on the
  # gate-up and down shapes at batch 1: DRAM throughput, occupancy, stalls.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "${FP8_NCU:-}" ] && [ -n "$NCU" ] && [ -x "$BIN/bench_gemv_cuda" ]; then
    for shape in "28672 4096" "4096 14336"; do
      for kernel in "gemv_f8 0 512" "gemv_f8 4 512" "gemv_kernel 0 512"; do
        set -- $kernel
        f="$OUT/ncu_$(echo "$shape $kernel" | tr ' ' _).txt"
        timeout 120 "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
          --section WarpStateStats --section MemoryWorkloadAnalysis -k "regex:$1" --launch-skip 2 --launch-count 1 \
          "$BIN/bench_gemv_cuda" profile $shape 1 "$2" "$3" > "$f" 2>&1
        echo "    ncu $shape $kernel: exit $?" >> "$REPORT"
        grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Registers Per|Theoretical Occupancy|Stall|Warp Cycles Per Issued|Issued Ipc|Block Limit" "$f" |
          head -24 | sed 's/^/      /' >> "$REPORT"
      done
    done
  fi
  make_llama8b
  # FP8_GEMV: gemv_f8 configurations to A/B ("stages,codes"; "default" = the
  # launcher's; "gemm": the launcher's with DEEPINFER_FP8_GEMM=1, batches of
  # 65-256 rows through the FP8 GEMM). FP8_BATCHES: the decode batches.
  for round in $(seq 1 "${FP8_ROUNDS:-2}"); do
    for q in none ${FP8_GEMV:-default}; do
      qz=fp8; [ "$q" = none ] && qz=none
      extra=""
      case "$q" in none|default) ;; gemm) extra="DEEPINFER_FP8_GEMM=1" ;; *) extra="DEEPINFER_GEMV_F8=$q" ;; esac
      env DEEPINFER_CUDA_FP8=1 $extra timeout 240 \
        "$BIN/deepinfer" bench --device cuda --model /tmp/deepinfer_e2e/llama8b \
        -b "${FP8_BATCHES:-1,4,32}" -p 128 -g 256 -r 1 --json --max-model-len 512 --quantization $qz \
        2>"$OUT/fp8_bench_$qz.log" |
        python3 -c 'import json,sys; print(" ".join("b%d: %.3f ms/step" % (p["batch"], 1000 * p["batch"] / p["decode_tok_s"]) for p in json.load(sys.stdin)))' |
        sed "s/^/    round $round weights=$q: /" >> "$REPORT"
    done
  done
fi
if has tput && [ -n "$BIN" ]; then
  # Where a large-batch decode step goes (issue 25): step time of B
  # sequences decoding one token after C cached tokens (bench --verify-curve,
  # k = 0 rows), for bf16 and FP8 KV; the growth with C is the attention's
  # share, to set against the KV bytes it reads (128 KiB a token in bf16).
  echo -e "\n## Decode step time vs context (llama8b; bench --verify-curve, k=0)\n" >> "$REPORT"
  make_llama8b
  for kv in auto fp8; do
    for q in ${TPUT_QUANT:-none}; do
      DEEPINFER_CUDA_FP8=1 timeout "${TPUT_TIMEOUT:-150}" "$BIN/deepinfer" bench --device cuda --model /tmp/deepinfer_e2e/llama8b \
        --verify-curve 1 -b ${TPUT_BATCHES:-1,64,256} -p ${TPUT_CONTEXTS:-16,1024,2048} -r 3 --json \
        --max-model-len 2100 --kv-cache-dtype $kv --quantization $q 2>"$OUT/tput_${kv}_$q.log" |
        python3 -c 'import json,sys; print("\n".join("batch %d context %d: %.3f ms" % (r["batch"], r["cached"], r["ms"]) for r in json.load(sys.stdin) if r["drafts"] == 0))' |
        sed "s/^/    kv=$kv weights=$q: /" >> "$REPORT"
    done
  done
fi
if has kvtiers; then
  # KV tiers (scripts/gpu_kv_tiers.py): TTFT of a repeated long context from
  # the host and disk tiers vs recompute, throughput at 0% hits with the
  # tiers on vs off, on the 8B shape.
  echo -e "\n## KV tiers\n" >> "$REPORT"
  make_llama8b
  timeout "${KVT_TIMEOUT:-560}" python3 scripts/gpu_kv_tiers.py --deepinfer "$BIN/deepinfer" \
    --model /tmp/deepinfer_e2e/llama8b --out "$OUT" --ctx "${KVT_CTX:-32768}" ${KVT_ARGS:-} > "$OUT/kv_tiers_stdout.log" 2>&1
  echo "gpu_kv_tiers: exit code $?" >> "$REPORT"
  cat "$OUT/kv_tiers.md" >> "$REPORT" 2>/dev/null || tail -30 "$OUT/kv_tiers_stdout.log" >> "$REPORT"
fi
if has disagg; then
  # Prefill/decode disaggregation on the one GPU (scripts/gpu_disagg.py): KV
  # handoff through a tmpfs directory, TTFT and decode ITL under a
  # prefill-heavy load, colocated vs disaggregated, on the 8B shape.
  echo -e "\n## Disaggregation\n" >> "$REPORT"
  make_llama8b
  timeout "${DIS_TIMEOUT:-540}" python3 scripts/gpu_disagg.py --deepinfer "$BIN/deepinfer" \
    --model /tmp/deepinfer_e2e/llama8b --out "$OUT" ${DIS_ARGS:-} > "$OUT/disagg_stdout.log" 2>&1
  echo "gpu_disagg: exit code $?" >> "$REPORT"
  cat "$OUT/disagg.md" >> "$REPORT" 2>/dev/null || tail -30 "$OUT/disagg_stdout.log" >> "$REPORT"
fi
if has bi; then
  # Batch invariance (DEEPINFER_BATCH_INVARIANT=1): the op tests' bitwise
  # checks, then scripts/gpu_batch_invariance.py (distinct outputs of one
  # prompt among 1,000 copies in batches of every shape, mode on and off; the
  # mode's throughput cost) on the 8B shape and (BI_MOE=1) a Qwen3-MoE slice
  # (BI_ARGS, BI_MOE_ARGS: gpu_batch_invariance.py options, BI_ARGS for both by default).
  echo -e "\n## Batch invariance\n" >> "$REPORT"
  # With the kernels the mode changed: MoE (its GEMM is shared now) and attention.
  # The default (larger batches through cuBLASLt without a split of k, then
  # wgmma), then wgmma without cuBLASLt, then mma.sync only, then the default
  # with attention in 256-key segments (DEEPINFER_BI_ATTENTION_SEGMENT).
  for paths in "1 1 0" "0 1 0" "0 0 0" "1 1 256"; do
    read -r cublas wgmma segment <<< "$paths"
    log="$OUT/bi_ops_cublas${cublas}_wgmma${wgmma}_segment${segment}.log"
    DEEPINFER_BI_CUBLAS=$cublas DEEPINFER_BI_WGMMA=$wgmma DEEPINFER_BI_ATTENTION_SEGMENT=$segment \
      timeout "${BI_OPS_TIMEOUT:-200}" "$BIN/test_ops" \
      --gtest_brief=1 --gtest_filter="${BI_OPS_FILTER:-*BatchInvariant*:*Moe*:*Attention*}" > "$log" 2>&1
    echo "test_ops BatchInvariant, DEEPINFER_BI_CUBLAS=$cublas DEEPINFER_BI_WGMMA=$wgmma" \
      "DEEPINFER_BI_ATTENTION_SEGMENT=$segment: exit code $?" >> "$REPORT"
    grep -E '^\[  (PASSED|FAILED) |Failure|Expected|run [0-9]|rows from|wgmma|mma.sync|cuBLASLt' "$log" | sort -u |
      head -20 | sed 's/^/    /' >> "$REPORT"
  done
  if [ -z "${BI_SKIP_DENSE:-}" ]; then
    make_llama8b
    timeout "${BI_TIMEOUT:-400}" python3 scripts/gpu_batch_invariance.py --deepinfer "$BIN/deepinfer" \
      --model /tmp/deepinfer_e2e/llama8b --out "$OUT/bi_llama8b.json" --label llama8b ${BI_ARGS:-} > "$OUT/bi_stdout.log" 2>&1
    echo "llama8b: exit code $?" >> "$REPORT"
    sed 's/^/    /' "$OUT/bi_llama8b.json" >> "$REPORT" 2>/dev/null || tail -20 "$OUT/bi_stdout.log" >> "$REPORT"
  fi
  if [ -n "${BI_MOE:-}" ]; then
    timeout 200 python3 scripts/make_random_model.py --shape qwen3_30b_a3b --layers "${BI_MOE_LAYERS:-8}" \
      --out /tmp/deepinfer_bi/qwen3moe >> "$OUT/bi_stdout.log" 2>&1
    timeout "${BI_TIMEOUT:-400}" python3 scripts/gpu_batch_invariance.py --deepinfer "$BIN/deepinfer" \
      --model /tmp/deepinfer_bi/qwen3moe --out "$OUT/bi_qwen3moe.json" --label qwen3moe --prefill-len 4000 \
      ${BI_MOE_ARGS:-${BI_ARGS:-}} >> "$OUT/bi_stdout.log" 2>&1
    echo "qwen3moe: exit code $?" >> "$REPORT"
    sed 's/^/    /' "$OUT/bi_qwen3moe.json" >> "$REPORT" 2>/dev/null || tail -20 "$OUT/bi_stdout.log" >> "$REPORT"
  fi
fi
if has mtp; then
  # Speculative decoding with DeepSeek-V3's MTP layer on CUDA: the new ops
  # against the CPU, the layer's logits against the CPU on the tiny
  # checkpoint, the oracle checkpoint's drafts accepted through the engine.
  echo -e "\n## MTP (test_ops, test_mla_models)\n" >> "$REPORT"
  timeout 200 "$BIN/test_ops" --gtest_filter='*ZeroRowsAtPosition*:*TokenProbs*' > "$OUT/mtp_tests.log" 2>&1
  echo "test_ops (new ops): exit code $?" >> "$REPORT"
  timeout 300 "$BIN/test_mla_models" --gtest_filter='MtpCuda*:DeepSeek/MlaModelCuda*:Mtp.*' >> "$OUT/mtp_tests.log" 2>&1
  echo "test_mla_models (MTP, MLA on CUDA): exit code $?" >> "$REPORT"
  grep -E '^\[(mtp|mla)|OK \]|FAILED|PASSED' "$OUT/mtp_tests.log" | sed 's/^/    /' >> "$REPORT"
fi
if has spec; then
  # Speculative decoding (scripts/bench_spec.py) on real GGUF weights carried
  # in parts (SPEC_GGUF, joined here as in e2e), then the verify-cost curve
  # of the 8B shape that the dynamic verify length reads. SPEC_ARGS: more
  # bench_spec.py options (--plain for a GGUF without a chat template).
  echo -e "\n## Speculative decoding\n" >> "$REPORT"
  for first in build-gguf/*.part_aa; do
    [ -f "$first" ] || continue
    cat "${first%aa}"* > "build-gguf/$(basename "$first" .part_aa)"
  done
  for m in ${SPEC_GGUF:-}; do
    timeout "${SPEC_TIMEOUT:-300}" python3 scripts/bench_spec.py --deepinfer "$BIN/deepinfer" --device cuda \
      --models "$m" --batches ${SPEC_BATCHES:-1 16 64 256} --repeats "${SPEC_REPEATS:-3}" \
      --max-tokens "${SPEC_MAX_TOKENS:-256}" --min-requests "${SPEC_MIN_REQUESTS:-1}" \
      ${SPEC_CONFIGS:+--configs $SPEC_CONFIGS} ${SPEC_ARGS:-} --json "$OUT/spec_$(basename "$m" .gguf).json" \
      > "$OUT/spec_$(basename "$m" .gguf).log" 2>&1
    echo "bench_spec $m: exit code $?" >> "$REPORT"
    sed 's/^/    /' "$OUT/spec_$(basename "$m" .gguf).log" | tail -60 >> "$REPORT"
    # SPEC_BI=1: the same under DEEPINFER_BATCH_INVARIANT=1 (short runs, one
    # batch size): every method's greedy text should equal no speculation's.
    if [ -n "${SPEC_BI:-}" ]; then
      DEEPINFER_BATCH_INVARIANT=1 timeout "${SPEC_BI_TIMEOUT:-150}" python3 scripts/bench_spec.py \
        --deepinfer "$BIN/deepinfer" --device cuda --models "$m" --batches ${SPEC_BI_BATCHES:-16} --repeats 1 \
        --max-tokens 256 --configs none ngram-k5 ngram-dyn suffix-k5 suffix-dyn \
        --json "$OUT/spec_bi_$(basename "$m" .gguf).json" > "$OUT/spec_bi_$(basename "$m" .gguf).log" 2>&1
      echo "bench_spec $m, DEEPINFER_BATCH_INVARIANT=1: exit code $?" >> "$REPORT"
      sed 's/^/    /' "$OUT/spec_bi_$(basename "$m" .gguf).log" | tail -20 >> "$REPORT"
    fi
  done
  if [ -n "${SPEC_CURVE:-}" ]; then
    make_llama8b
    echo -e "\n### Verify-cost curve, llama8b (deepinfer bench --verify-curve 8)\n" >> "$REPORT"
    timeout 240 "$BIN/deepinfer" bench --device cuda --model /tmp/deepinfer_e2e/llama8b --verify-curve 8 \
      -b ${SPEC_CURVE_BATCHES:-1,16,64,256} -p 1024 -r 5 > "$OUT/verify_curve.txt" 2> "$OUT/verify_curve.log"
    echo "exit code $?" >> "$REPORT"
    sed 's/^/    /' "$OUT/verify_curve.txt" >> "$REPORT"
  fi
fi
if has structured; then
  # Structured output on the 8B shape: decode tok/s under a JSON schema vs
  # unconstrained (scripts/bench_structured.py). The model gets the real
  # Llama 3.1 tokenizer (carried in build-gguf/llama3_1/), whose 128,256
  # tokens match its vocabulary, so the grammar masks are those of real text.
  echo -e "\n## Structured output (llama8b, Llama 3.1 tokenizer)\n" >> "$REPORT"
  make_llama8b
  if [ -f build-gguf/llama3_1/tokenizer.json.xz ]; then
    xz -dc build-gguf/llama3_1/tokenizer.json.xz > /tmp/deepinfer_e2e/llama8b/tokenizer.json
    cp build-gguf/llama3_1/tokenizer_config.json /tmp/deepinfer_e2e/llama8b/tokenizer_config.json
  fi
  timeout "${STRUCTURED_TIMEOUT:-400}" python3 scripts/bench_structured.py --deepinfer "$BIN/deepinfer" --device cuda \
    --model /tmp/deepinfer_e2e/llama8b --batches ${STRUCTURED_BATCHES:-1 64} --max-tokens "${STRUCTURED_MAX_TOKENS:-256}" \
    --repeats "${STRUCTURED_REPEATS:-3}" --json "$OUT/structured.json" > "$OUT/structured.log" 2>&1
  echo "exit code $?" >> "$REPORT"
  sed 's/^/    /' "$OUT/structured.log" | tail -20 >> "$REPORT"
fi
if has sweep; then
  # Serving curves (deepinfer bench sweep): output tok/s per GPU and per user
  # at each concurrency, for the 8B shape and a Qwen3-30B-A3B-shaped slice;
  # one CSV (sweep.csv) that scripts/plot_sweep.py draws on the CPU machine.
  echo -e "\n## Serving sweep (deepinfer bench sweep)\n" >> "$REPORT"
  make_llama8b
  SW_ARGS="--device cuda --concurrency ${SWEEP_CONCURRENCY:-1,4,16,64,128,256} --input-len ${SWEEP_INPUT:-1000} --output-len ${SWEEP_OUTPUT:-256} --csv $OUT/sweep.csv"
  timeout 240 "$BIN/deepinfer" bench sweep $SW_ARGS --model /tmp/deepinfer_e2e/llama8b \
    --label "Llama-3-8B shape, bf16" > "$OUT/sweep.log" 2>&1
  echo "llama8b exit code $?" >> "$REPORT"
  timeout 200 python3 scripts/make_random_model.py --shape qwen3_30b_a3b --layers "${SWEEP_MOE_LAYERS:-16}" \
    --out /tmp/deepinfer_sweep/qwen3moe >> "$OUT/sweep.log" 2>&1
  timeout 240 "$BIN/deepinfer" bench sweep $SW_ARGS --model /tmp/deepinfer_sweep/qwen3moe \
    --label "Qwen3-30B-A3B shape (${SWEEP_MOE_LAYERS:-16} of 48 layers), bf16" >> "$OUT/sweep.log" 2>&1
  echo "qwen3moe exit code $?" >> "$REPORT"
  sed 's/^/    /' "$OUT/sweep.log" | grep -v "^    \[" | tail -30 >> "$REPORT"
fi
if has eval; then
  # Generation for `deepinfer eval` with the two real small models (GGUF,
  # carried in parts into build-gguf/, with .cache/eval from
  # scripts/fetch_eval_data.sh); grading runs on the CPU machine. The
  # generation files come back gzipped.
  echo -e "\n## Evaluation generation (deepinfer eval generate)\n" >> "$REPORT"
  mkdir -p /tmp/deepinfer_eval
  for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
    if [ ! -s "/tmp/deepinfer_eval/$m" ] && ls build-gguf/$m.part_* > /dev/null 2>&1; then
      cat build-gguf/$m.part_* > "/tmp/deepinfer_eval/$m"
    fi
    echo "- $m: $(sha256sum "/tmp/deepinfer_eval/$m" 2>&1 | cut -c1-64)" >> "$REPORT"
  done
  EV_COMMON="--task ${EVAL_TASKS:-humaneval,mbpp} --data-dir .cache/eval --max-tokens ${EVAL_MAX_TOKENS:-512} --max-model-len 4096 --max-num-seqs 256 -q ${EVAL_LIMIT:+--limit $EVAL_LIMIT} --device ${EVAL_DEVICE:-cuda}"
  EV_SAMPLED="--num-samples ${EVAL_SAMPLES:-10} --temperature 0.8 --top-p 0.95 --seed 1"
  eval_run() {  # eval_run NAME MODEL ARGS...
    local name="$1" model="$2"; shift 2
    name="$name${EVAL_SUFFIX:-}"
    timeout "${EVAL_TIMEOUT:-240}" "$BIN/deepinfer" eval generate $EV_COMMON --model "/tmp/deepinfer_eval/$model" "$@" \
      -o "/tmp/deepinfer_eval/$name.jsonl" >> "$OUT/eval.log" 2>&1
    echo "- $name: exit code $?, $(tail -1 "$OUT/eval.log")" >> "$REPORT"
  }
  eval_run smollm2_chat_sampled SmolLM2-135M-Instruct.Q4_1.gguf --chat $EV_SAMPLED
  eval_run smollm2_chat_greedy SmolLM2-135M-Instruct.Q4_1.gguf --chat
  [ -n "${EVAL_NO_COMPLETION_SMOLLM2:-}" ] || eval_run smollm2_completion_sampled SmolLM2-135M-Instruct.Q4_1.gguf $EV_SAMPLED
  eval_run gemma3_completion_sampled gemma-3-270m-q4_k_m.gguf $EV_SAMPLED
  eval_run gemma3_completion_greedy gemma-3-270m-q4_k_m.gguf
  tar -C /tmp/deepinfer_eval -czf "$OUT/eval_generations.tar.gz" $(cd /tmp/deepinfer_eval && ls *.jsonl)
fi
if has kernels; then
  # Kernel micro-benchmarks, when staged: attention (SIMT vs tensor-core
  # kernels, incl. MLA's latent cache, and the batch-invariant plan), the MoE
  # layer kernels (the batch-invariant mode's grouped GEMM tiles too), and the
  # batch-invariant linear's tile configurations
  # against cuBLAS (KERNEL_BENCHES picks among them).
  # An entry "bench:arg" passes arg after the repetitions (bench_moe_cuda:bi).
  for entry in ${KERNEL_BENCHES:-bench_attention_cuda bench_moe_cuda bench_moe_cuda:bi bench_moe_bi_tiles bench_bi_linear}; do
    b=${entry%%:*}
    arg=${entry#"$b"}
    arg=${arg#:}
    [ -x "$BIN/$b" ] || continue
    echo -e "\n## Kernels: $entry\n" >> "$REPORT"
    timeout 240 "$BIN/$b" "${KERNEL_REPS:-20}" $arg > "$OUT/$b${arg:+_$arg}.txt" 2>&1
    echo "exit code $?" >> "$REPORT"
    sed 's/^/    /' "$OUT/$b${arg:+_$arg}.txt" >> "$REPORT"
  done
fi
if has ncu_attention; then
  # Nsight Compute's throughput, warp-state and occupancy sections for the
  # tensor-core attention kernels of the bench_attention_cuda cases whose
  # names contain NCU_CASES (each case launches every plan it compares).
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo -e "\n## ncu: attention kernels of '${NCU_CASES:-decode 1 x 640, 8 kv}'\n" >> "$REPORT"
  BENCH_ATTENTION_CASES="${NCU_CASES:-decode 1 x 640, 8 kv}" timeout 240 "$ncu_bin" -k regex:attention_mma_kernel \
    -c "${NCU_COUNT:-24}" --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    "$BIN/bench_attention_cuda" 1 > "$OUT/ncu_attention.txt" 2>&1
  echo "exit code $? ($(grep -c 'attention_mma_kernel' "$OUT/ncu_attention.txt") kernels profiled)" >> "$REPORT"
fi
if has moe; then
  for shape in ${MOE_SHAPES:-qwen3_30b_a3b deepseek_v2_lite}; do
    echo -e "\n## MoE decode: $shape-shaped slice vs transformers (scripts/gpu_bench_moe.py)\n" >> "$REPORT"
    timeout "${MOE_TIMEOUT:-420}" python3 scripts/gpu_bench_moe.py --deepinfer "$BIN/deepinfer" --out "$OUT" \
      --shape "$shape" --layers "${MOE_LAYERS:-16}" ${MOE_PROFILE_BATCH:+--profile-batch $MOE_PROFILE_BATCH} ${MOE_NCU:+--ncu "$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"} \
      > "$OUT/bench_moe_$shape.log" 2>&1
    echo "exit code $?" >> "$REPORT"
    grep '^\[moe' "$OUT/bench_moe_$shape.log" | sed 's/^/    /' >> "$REPORT"
    rm -rf "/tmp/deepinfer_moe_bench/$shape"  # disk: one slice at a time
  done
fi
cat "$REPORT"
