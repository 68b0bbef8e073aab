#!/usr/bin/env bash
# JSON-schema structured output on the host, our XGrammar integration: compile
# time and per-step token-mask time over tests/data/json_schemas/schemas.jsonl,
# each schema driven along a minimal and a rich valid instance
# (scripts/json_instance.py), with the Llama 3.1 tokenizer. The counterpart of
# scripts/bench_grammar_llguidance.py (same corpus, instances and method).
#
#   scripts/bench_grammar.sh [--repeat N] [--limit K] [--out-dir DIR]
#
# Builds build/bench_grammar if needed, writes DIR/grammar_{minimal,rich}.json
# (default DIR: a temp folder, printed at the end) and prints both summaries.
# The bench's stderr (progress) goes to DIR/grammar_*.log; XGrammar's warnings
# (keywords or regex features it ignores) are counted in the summaries and
# listed per schema in the JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

repeat=3
limit=0
out_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    *) echo "usage: $0 [--repeat N] [--limit K] [--out-dir DIR]" >&2; exit 2 ;;
  esac
done

schemas=$root/tests/data/json_schemas/schemas.jsonl
tok_src=${DEEPINFER_TOKENIZERS:-$root/../shared/tokenizers}/llama3_1
cmake=${CMAKE:-/usr/bin/cmake}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -n "$out_dir" ] || out_dir=$(mktemp -d /tmp/bench_grammar.XXXXXX)
mkdir -p "$out_dir"

# The tokenizer: tokenizer.json (decompressed) with tokenizer_config.json beside it.
mkdir -p "$work/tokenizer"
if [ -f "$tok_src/tokenizer.json" ]; then
  cp "$tok_src/tokenizer.json" "$work/tokenizer/"
else
  xz -dc "$tok_src/tokenizer.json.xz" > "$work/tokenizer/tokenizer.json"
fi
cp "$tok_src/tokenizer_config.json" "$work/tokenizer/"

python3 scripts/json_instance.py "$schemas" "$work/minimal.jsonl"
python3 scripts/json_instance.py "$schemas" "$work/rich.jsonl" --rich

"$cmake" -S . -B build > /dev/null  # picks up bench/bench_grammar.cpp if new
"$cmake" --build build -j2 --target bench_grammar

for kind in minimal rich; do
  echo "== $kind instances" >&2
  ./build/bench_grammar "$work/tokenizer" "$schemas" "$work/$kind.jsonl" \
    --repeat "$repeat" --limit "$limit" --out "$out_dir/grammar_$kind.json" \
    > "$out_dir/grammar_$kind.txt" 2> "$out_dir/grammar_$kind.log"
done
for kind in minimal rich; do
  echo
  echo "===== $kind instances ====="
  cat "$out_dir/grammar_$kind.txt"
done
echo
echo "results: $out_dir/grammar_{minimal,rich}.{json,txt}"
