#!/usr/bin/env bash
# A long fuzzing run: each target runs as J parallel libFuzzer jobs (sharing
# one corpus) until the target has executed at least RUNS inputs or MAX_TIME
# seconds have passed, with the same limits as tests/fuzz/run.sh (stack, max
# length, malloc limit). Prints executions per target and any finding.
# Uses the staged targets of scripts/fuzz_stage.sh (fuzz-stage/stage.tar.gz).
#   PLAN="server_request:6 gguf:1" RUNS=10000000 MAX_TIME=540 OUT=dir scripts/fuzz_nightly.sh
# PLAN entries may set their own count: target:jobs:runs. RESUME=1 keeps the
# corpora of an earlier run in $FUZZ_WORK (executions then add up).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out="${OUT:-$root/fuzz-nightly}"
runs="${RUNS:-10000000}"
max_time="${MAX_TIME:-540}"
work="${FUZZ_WORK:-/tmp/fuzz-nightly}"
if [ "${RESUME:-0}" != 1 ] || [ ! -d "$work/bin" ]; then
  rm -rf "$work" && mkdir -p "$work"
  tar -C "$work" -xzf fuzz-stage/stage.tar.gz
fi
mkdir -p "$out" "$work/src"
export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DEEPINFER_SOURCE_DIR="$work/src"  # so that $DEEPINFER_SOURCE_DIR/../shared is the staged copy
plan="${PLAN:?PLAN=target:jobs ...}"
pids=()
for entry in $plan; do
  IFS=: read -r t jobs target_runs <<<"$entry"
  target_runs="${target_runs:-$runs}"
  max_len=16384
  [ "$t" = output_parser ] && max_len=4096
  per_job=$(((target_runs + jobs - 1) / jobs))
  mkdir -p "$out/$t" "$work/artifacts/$t"
  args=(-runs="$per_job" -max_total_time="$max_time" -timeout=5 -rss_limit_mb=2048 -malloc_limit_mb=1024
    -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$work/artifacts/$t/")
  [ -f "$work/dict/$t.dict" ] && args+=(-dict="$work/dict/$t.dict")
  for ((j = 0; j < jobs; ++j)); do
    (ulimit -s 1024 && "$work/bin/fuzz_$t" "${args[@]}" "$work/corpus/$t"; echo $? >"$out/$t/job$j.rc") \
      >"$out/$t/job$j.log" 2>&1 &
    pids+=($!)
  done
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
printf '%-18s %6s %14s %12s  %s\n' target jobs executions seconds result
for entry in $plan; do
  IFS=: read -r t jobs _ <<<"$entry"
  execs=0
  secs=0
  for log in "$out/$t"/job*.log; do
    e=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n1)
    execs=$((execs + ${e:-0}))
    s=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | awk '{print $5}' | tail -n1)
    [ "${s:-0}" -gt "$secs" ] && secs=${s:-0}
  done
  findings=$(ls "$work/artifacts/$t" 2>/dev/null | wc -l)
  bad_rc=$(cat "$out/$t"/job*.rc 2>/dev/null | grep -cv '^0$')
  if [ "$bad_rc" -gt 0 ] && [ "$findings" -eq 0 ]; then
    result="FAILED: $bad_rc job(s) exited non-zero without an input (see the logs)"
    failed=1
  elif [ "$findings" -gt 0 ]; then
    result="FINDINGS: $findings (copied to $out/$t/)"
    cp "$work/artifacts/$t"/* "$out/$t/" 2>/dev/null
    failed=1
  else
    result="no finding"
  fi
  printf '%-18s %6s %14s %12s  %s\n' "$t" "$jobs" "$execs" "$secs" "$result"
done
exit "$failed"
