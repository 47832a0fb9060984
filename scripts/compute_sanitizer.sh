#!/usr/bin/env bash
# compute-sanitizer over the GPU tests of every op and of the executor, on the GPU machine: memcheck,
# racecheck, synccheck and initcheck, each over the same test cases, one process per (tool, case)
# so that a kernel a tool aborts, or a case past its limit, costs that case only. The four tools
# run at the same time (one GPU, one process each; the tools are CPU-bound), so the script ends
# within ~6 minutes. Then one summary line per tool, and per tool its reports deduplicated.
#
# usage: scripts/compute_sanitizer.sh BIN_DIR     (BIN_DIR holds spgraph_gpu_tests built for sm_90a;
#                                                  with -lineinfo, reports name source lines)
# Writes under $OUT (default /tmp/spgraph-sanitize): summary.txt (per tool: errors, seconds, cases
# passed; then the distinct reports), and logs.tgz (every log).
#
# The cases (what each op's kernels run under the tools):
#   sparse_mla: small problem for the sanitizers     every attention kernel path (wgmma single pass,
#                                                     split top-k and the merge, mma.sync) on one problem
#   insert quantizes rows into the cache ...          the insert (listed slots), eager and replayed
#   insert derives SWA slots from the block table*    the insert with derived slots
#   gather of both parts in one launch*               the gather, compressed and window parts
#   combine for C4A*, combine for SWA-only layers*    the combine, r = 4 and r = 1
#   faults are counted over the whole run*            the executor: warm-up (every kernel of every
#                                                     bucket eagerly, then captured), stage-in with
#                                                     the fault fold, six steps eager and replayed
#   empty work*                                       the executor on empty chunks
#   sanitizer probe: ... (racecheck only, 2 cases)   a bar.arrive / bar.sync hand-off and its
#                                                     bar.sync control (tests/gpu/test_sanitizer_probes.cu)
# A report is "distinct" by its kind and the source line (or PC) of its first frame; addresses,
# thread and block numbers are dropped.
set -uo pipefail
if [[ $# -lt 1 || ! -x $1/spgraph_gpu_tests ]]; then
  echo "usage: $0 BIN_DIR (with spgraph_gpu_tests)" >&2
  exit 2
fi
BIN=$1
export PATH=$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer
OUT=${OUT:-/tmp/spgraph-sanitize}
LOGS=$(mktemp -d)
mkdir -p "$OUT"
command -v compute-sanitizer >/dev/null 2>&1 || { echo "$0: compute-sanitizer not on PATH" | tee "$OUT/summary.txt"; exit 2; }
CASES=('sparse_mla: small problem for the sanitizers'
       'insert quantizes rows into the cache exactly as the reference'
       'insert derives SWA slots from the block table*'
       'gather of both parts in one launch*'
       'combine for C4A*'
       'combine for SWA-only layers*'
       'faults are counted over the whole run*'
       'empty work*')
declare -A EXTRA=([memcheck]="--leak-check full" [racecheck]="--racecheck-report all" [synccheck]="" [initcheck]="")
LIMIT=${SANITIZE_CASE_LIMIT:-300}  # seconds per (tool, case)

# One tool over every case; writes $LOGS/<tool>.<i>.log and $LOGS/<tool>.result.
sweep() {
  local tool=$1 i=0 passed=0 failed=0 errors=0 t0=$SECONDS
  local cases=("${CASES[@]}")
  [[ $tool == racecheck ]] && cases+=('sanitizer probe: a bar.arrive*' 'sanitizer probe: the same hand-off*')
  for c in "${cases[@]}"; do
    i=$((i + 1))
    local log=$LOGS/$tool.$i.log
    # shellcheck disable=SC2086
    local limit=200  # reports printed (the tool still counts them all); every one for the probes
    [[ $c == sanitizer* ]] && limit=0
    timeout "$LIMIT" compute-sanitizer --tool "$tool" ${EXTRA[$tool]} --print-limit "$limit" --error-exitcode 3 \
      "$BIN/spgraph_gpu_tests" "$c" --reporter compact >"$log" 2>&1
    local rc=$? n
    n=$(grep -oE "(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)" "$log" | tail -1 | grep -oE "[0-9]+" | head -1)
    errors=$((errors + ${n:-0}))
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "  $tool [$c]: timed out after $LIMIT s" >>"$LOGS/$tool.cases"
      failed=$((failed + 1))
    elif grep -qE "^(All tests passed|Passed )" "$log"; then
      echo "  $tool [$c]: ${n:-0} reports, passed" >>"$LOGS/$tool.cases"
      passed=$((passed + 1))
    else
      echo "  $tool [$c]: ${n:-0} reports, FAILED (exit $rc): $(grep -m1 -E 'failed|FAILED|Error' "$log" | cut -c1-160)" >>"$LOGS/$tool.cases"
      failed=$((failed + 1))
    fi
  done
  echo "$tool: $errors reports, $((SECONDS - t0)) s; cases: $passed passed, $failed failed" >"$LOGS/$tool.result"
}

# Distinct reports of one tool: kind | first frame (file:line when built with -lineinfo, else PC),
# and for racecheck the other access's frame too.
distinct() {
  cat "$LOGS/$1".[0-9]*.log 2>/dev/null | awk '
    function frame(line) { sub(/^=========  +/, "", line); sub(/\(.*\)\+/, "+", line); sub(/Thread \([0-9,]+\) /, "", line); return line }
    function flush() { if (kind != "") print kind " | " f1 (f2 == "" ? "" : " | " f2); kind = "" }
    /^========= [A-Z]/ && !/SUMMARY|COMPUTE-SANITIZER|Program hit|Target application/ {flush(); kind=$0; sub(/^========= /, "", kind); sub(/ (at|in block) .*/, "", kind); f1=""; f2=""; next}
    kind != "" && f1 == "" && /^=========  +/ && / at / {f1 = frame($0); next}
    kind != "" && f1 != "" && f2 == "" && /^=========  +(Read|Write) Thread/ {f2 = frame($0); next}
    END {flush()}' |
    sed -E 's/0x[0-9a-f]{5,}/ADDR/g' | sort | uniq -c | sort -rn | head -8
}

for tool in memcheck racecheck synccheck initcheck; do sweep "$tool" & done
wait
{
  for tool in memcheck racecheck synccheck initcheck; do cat "$LOGS/$tool.result"; done
  for tool in memcheck racecheck synccheck initcheck; do
    echo "== $tool"
    cat "$LOGS/$tool.cases"
    distinct "$tool" | sed 's/^/  /'
  done
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C "$LOGS" .
rm -rf "$LOGS"
