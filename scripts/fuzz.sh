#!/usr/bin/env bash
# Fuzzes each libFuzzer target of tests/fuzz for a bounded time, from a scratch copy of its
# committed seed corpus (the repository is never written), two targets at a time.
# Usage: scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET]   (defaults: build/asan 30)
# A property failure, sanitizer report, crash or timeout of any target makes the exit code 1; its
# input is kept under $FUZZ_ARTIFACTS (default /tmp/spgraph-fuzz) for replaying:
#   BUILD_DIR/tests/fuzz/TARGET ARTIFACT
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/asan}
seconds=${2:-30}
artifacts=${FUZZ_ARTIFACTS:-/tmp/spgraph-fuzz}
targets=(fuzz_chunk fuzz_executor_plan fuzz_scheduler fuzz_serve_loop_flags)
rm -rf "$artifacts" && mkdir -p "$artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

fuzz_one() {
  local t=$1 bin="$build/tests/fuzz/$1" work="$artifacts/$1"
  mkdir -p "$work/corpus"
  if [ ! -x "$bin" ]; then
    echo "$t: not built ($bin)" >"$work/summary"
    return 1
  fi
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/" 2>/dev/null
  "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 \
    -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1
  local rc=$?
  local runs
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$work/log" | grep -oE '[0-9]+$')
  if [ $rc -eq 0 ]; then
    echo "$t: ok, ${runs:-?} inputs in ${seconds} s" >"$work/summary"
  else
    echo "$t: FAILED (exit $rc): $(grep -m1 -E 'property failed|runtime error|ERROR: |deadly signal' "$work/log")" >"$work/summary"
    ls "$work"/crash-* "$work"/timeout-* "$work"/leak-* "$work"/oom-* 2>/dev/null | sed 's/^/  input: /' >>"$work/summary"
  fi
  return $rc
}

failed=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  pids=()
  for t in "${targets[@]:i:2}"; do
    fuzz_one "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
done
for t in "${targets[@]}"; do cat "$artifacts/$t/summary"; done
exit $failed
