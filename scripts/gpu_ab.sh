#!/usr/bin/env bash
# Same-run A/B of two deepinfer builds on the GPU machine: scripts/gpu_bench.py
# (batch-1 decode, 256 x 1k/1k at --max-num-batched-tokens 8192) for each,
# interleaved ROUNDS times, on the Llama-3-8B-shaped random model.
#   scripts/gpu_ab.sh DIR_A DIR_B     each DIR holds bin.tar.xz (deepinfer); the
#                                     shared libraries from $LIBS (default build-gpu/lib.tar.xz)
# Writes ab.md and the per-run JSON into $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/deepinfer_ab_out}"
ROUNDS="${ROUNDS:-2}"
mkdir -p "$OUT" /tmp/deepinfer_libs
export PYTHONUNBUFFERED=1
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
tar -C /tmp/deepinfer_libs -xJf "${LIBS:-build-gpu/lib.tar.xz}"
export LD_LIBRARY_PATH="/tmp/deepinfer_libs/lib:$LD_LIBRARY_PATH"
for side in A B; do
  dir=$([ $side = A ] && echo "$1" || echo "$2")
  mkdir -p "/tmp/ab_$side" && tar -C "/tmp/ab_$side" -xJf "$dir/bin.tar.xz"
done
[ -f /tmp/deepinfer_e2e/llama8b/config.json ] || timeout 300 python3 -c "import sys; sys.path.insert(0, 'scripts'); \
import gpu_e2e; gpu_e2e.build_model('llama8b', '/tmp/deepinfer_e2e/llama8b')" > "$OUT/make_llama8b.log" 2>&1
echo "| round | build | batch-1 ms/token | roofline fraction | 256 x 1k/1k tok/s |" > "$OUT/ab.md"
echo "|---|---|---|---|---|" >> "$OUT/ab.md"
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    mkdir -p "/tmp/ab_${side}_$round"
    timeout "${AB_TIMEOUT:-200}" python3 scripts/gpu_bench.py --deepinfer "/tmp/ab_$side/bin/deepinfer" \
      --model /tmp/deepinfer_e2e/llama8b --out "/tmp/ab_${side}_$round" --skip small,peer,pipeline,prefill \
      --reps 3 --batch-kv-dtypes auto --batch-budgets 8192 --batch-timeout 150 > "$OUT/ab_${side}_$round.log" 2>&1
    python3 - "$round" "$side" "/tmp/ab_${side}_$round/bench.json" >> "$OUT/ab.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
print(f"| {sys.argv[1]} | {sys.argv[2]} | {r.get('decode_b1_ms_per_token', 0):.3f} | "
      f"{r.get('roofline_fraction', 0):.3f} | {r.get('batch_output_tok_s', 0):.0f} |")
PY
  done
done
cat "$OUT/ab.md"
