#!/usr/bin/env bash
# compute-sanitizer over the GPU tests of every op and of the executor, on the GPU machine: one
# run each of memcheck, racecheck, synccheck and initcheck over the same small test cases, each
# under its own time limit so the whole script ends within ~8 minutes, then one summary line per
# tool. Also `scripts/h200_run.sh BIN_DIR sanitize`.
#
# usage: scripts/compute_sanitizer.sh BIN_DIR     (BIN_DIR holds spgraph_gpu_tests built for sm_90a;
#                                                  with -lineinfo, reports name source lines)
# Writes under $OUT (default /tmp/spgraph-sanitize): <tool>.log, synccheck_distinct.txt (the
# synccheck reports deduplicated by kind, PC and barrier address), summary.txt.
#
# The cases (what each op's kernels run under the tools):
#   sparse_mla: small problem for the sanitizers     every attention kernel (wgmma cp.async, TMA
#                                                     gather, cluster multicast, mma.sync; single
#                                                     pass, split top-k and the merge) on one problem
#   insert quantizes rows into the cache ...          the insert (listed slots), eager and replayed
#   insert derives SWA slots from the block table*    the insert with derived slots
#   gather of both parts in one launch*               the gather, compressed and window parts
#   combine for C4A*, combine for SWA-only layers*    the combine, r = 4 and r = 1
#   faults are counted over the whole run*            the executor: warm-up (every kernel of every
#                                                     bucket eagerly, then captured), stage-in with
#                                                     the fault fold, six steps eager and replayed
#   empty work*                                       the executor on empty chunks
# Limits (s): memcheck 140, racecheck 150, synccheck 100, initcheck 100; a tool past its limit is
# reported "timed out" (its log holds what it saw until then).
set -uo pipefail
if [[ $# -lt 1 || ! -x $1/spgraph_gpu_tests ]]; then
  echo "usage: $0 BIN_DIR (with spgraph_gpu_tests)" >&2
  exit 2
fi
BIN=$1
export PATH=$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer
OUT=${OUT:-/tmp/spgraph-sanitize}
mkdir -p "$OUT"
command -v compute-sanitizer >/dev/null 2>&1 || { echo "$0: compute-sanitizer not on PATH" | tee "$OUT/summary.txt"; exit 2; }
SPEC='sparse_mla: small problem for the sanitizers,insert quantizes rows into the cache exactly as the reference,insert derives SWA slots from the block table*,gather of both parts in one launch*,combine for C4A*,combine for SWA-only layers*,faults are counted over the whole run*,empty work*'

declare -A LIMIT=([memcheck]=140 [racecheck]=150 [synccheck]=100 [initcheck]=100)
declare -A EXTRA=([memcheck]="--leak-check full" [racecheck]="--racecheck-report hazard" [synccheck]="" [initcheck]="")
: >"$OUT/summary.txt"
for tool in memcheck racecheck synccheck initcheck; do
  t0=$SECONDS
  # --print-limit 0: every report (synccheck's are deduplicated below); --error-exitcode: the tool's verdict.
  # shellcheck disable=SC2086
  timeout "${LIMIT[$tool]}" compute-sanitizer --tool "$tool" ${EXTRA[$tool]} --print-limit 0 --error-exitcode 3 \
    "$BIN/spgraph_gpu_tests" "$SPEC" --reporter compact >"$OUT/$tool.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$OUT/$tool.log" | tail -1 | grep -oE "[0-9]+")
  tests=$(grep -E "^(Passed|Failed|test cases)" "$OUT/$tool.log" | tail -1)
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="timed out after ${LIMIT[$tool]} s"
  elif [[ -z $errors ]]; then
    verdict="no ERROR SUMMARY (exit $rc)"
  else
    verdict="$errors errors (exit $rc)"
  fi
  echo "$tool: $verdict, ${secs} s; tests: ${tests:-?}" | tee -a "$OUT/summary.txt"
done

# synccheck's reports, one line per distinct (kind, PC, barrier): whether the ~15,000 "missing
# wait" reports of the sanitizer problem are one barrier at one PC or many.
if [[ -f $OUT/synccheck.log ]]; then
  # A report starts with an unindented "========= <what>" line; its "at 0x<pc>" line and any
  # line naming a barrier address follow, indented.
  awk 'function flush() { if (kind != "") print kind " | pc " (pc == "" ? "?" : pc) " | barrier " (bar == "" ? "?" : bar) }
       /^========= [^ ]/ && !/ERROR SUMMARY|COMPUTE-SANITIZER/ {flush(); kind=$0; sub(/^========= /, "", kind); pc=""; bar=""; next}
       /^=========  / && / at 0x[0-9a-f]+/ && pc == "" {pc=$0; sub(/.* at /, "", pc); sub(/ .*/, "", pc)}
       /^=========  / && /[Bb]arrier/ && /0x[0-9a-f]+/ && bar == "" {bar=$0; sub(/.*0x/, "0x", bar); sub(/[^0-9a-fx].*/, "", bar)}
       END {flush()}' "$OUT/synccheck.log" | sort | uniq -c | sort -rn >"$OUT/synccheck_distinct.txt"
  echo "synccheck: $(wc -l <"$OUT/synccheck_distinct.txt") distinct (kind, pc, barrier) among its reports; the most frequent:" | tee -a "$OUT/summary.txt"
  head -5 "$OUT/synccheck_distinct.txt" | sed 's/^/  /' | tee -a "$OUT/summary.txt"
fi
