#!/usr/bin/env bash
# A/B of the sparse attention kernels on the GPU machine, in one device call (issue 15):
#   1. the [sparse_mla] GPU tests (every kernel path, eager and graph-replayed),
#   2. compute-sanitizer memcheck on the sanitizer problem (the test case that runs every
#      attention kernel on one small problem),
#   3. table A with every variant timed in rotating order over several rounds (bench --paths
#      --rounds: each round starts one variant later, so each variant sees the same power history;
#      sustained timing, 25 ms warm-up and >= 100 ms timed per variant and round),
# then prints a short table last: row, variant, kernel, median us, TFLOP/s, ratio to FlashMLA's
# figure of 2026-12-01 (docs/benchmarks.md, table A; the figures are constants in
# samples/bench/bench_attention.cpp) and vs_auto (the row's automatic time / the variant's: the A/B).
#
# usage: scripts/attention_ab.sh BIN_DIR [--rows LIST] [--rounds N] [--paths LIST] [--skip-tests]
#   BIN_DIR   holds spgraph_gpu_tests and bench, built for sm_90a; run from the repository root
#   --rows    table A rows whose name contains one of the comma-separated parts (default: all 18)
#   --rounds  timing rounds per row (default 2)
#   --paths   SparseMlaPath names to time (default below: automatic, the wgmma single pass and
#             split; a path whose plan repeats a kernel already timed on a row is skipped, e.g.
#             single_pass on the long rows, where automatic runs it)
#   --skip-tests  only the benchmark
# Writes under $OUT (default /tmp/attention_ab): tests.log, memcheck.log, bench.log,
# attention_ab.json. Expected on the H200: ~1-1.5 min of tests, under 1 min of memcheck, under
# 1 min of bench (2 rounds); each step has its own time limit (140 s, 60 s, 90 s), so the script
# ends within 5 minutes (with --skip-tests within 1.5).
set -uo pipefail

if [[ $# -lt 1 || ! -d $1 ]]; then
  echo "usage: $0 BIN_DIR [--rows LIST] [--rounds N] [--paths LIST] [--skip-tests]" >&2
  exit 2
fi
BIN=$1
shift
ROWS=""
ROUNDS=2
PATHS=automatic,single_pass,split_topk
SKIP_TESTS=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --rows) ROWS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --paths) PATHS=$2; shift 2 ;;
    --skip-tests) SKIP_TESTS=1; shift ;;
    *) echo "$0: unknown flag $1" >&2; exit 2 ;;
  esac
done
export PATH=$PATH:/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer
OUT=${OUT:-/tmp/attention_ab}
mkdir -p "$OUT"
for b in spgraph_gpu_tests bench; do
  [[ -x $BIN/$b ]] || { echo "$0: $BIN/$b missing" >&2; exit 2; }
done

tests_rc=skipped
memcheck_rc=skipped
start=$SECONDS
if [[ $SKIP_TESTS -eq 0 ]]; then
  echo "== [sparse_mla] GPU tests"
  timeout 140 "$BIN/spgraph_gpu_tests" "[sparse_mla]" --reporter compact --durations yes >"$OUT/tests.log" 2>&1
  tests_rc=$?
  tail -n 3 "$OUT/tests.log"
  echo "   rc $tests_rc, $((SECONDS - start)) s"

  t0=$SECONDS
  echo "== compute-sanitizer memcheck, sanitizer problem"
  if command -v compute-sanitizer >/dev/null 2>&1; then
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
      "$BIN/spgraph_gpu_tests" "sparse_mla: small problem for the sanitizers" >"$OUT/memcheck.log" 2>&1
    memcheck_rc=$?
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -n 3
  else
    echo "   compute-sanitizer not on PATH" | tee "$OUT/memcheck.log"
    memcheck_rc=missing
  fi
  echo "   rc $memcheck_rc, $((SECONDS - t0)) s"
fi

t0=$SECONDS
echo "== table A: paths $PATHS, $ROUNDS rounds${ROWS:+, rows $ROWS}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader \
    | sed 's/^/   /'
fi
bench_args=(--tables A --paths "$PATHS" --rounds "$ROUNDS" --json "$OUT/attention_ab.json")
[[ -n $ROWS ]] && bench_args+=(--rows "$ROWS")
commit=$(cat "$BIN/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
SPGRAPH_COMMIT=${SPGRAPH_COMMIT:-$commit} \
  timeout 90 "$BIN/bench" "${bench_args[@]}" >"$OUT/bench.log" 2>&1
bench_rc=$?
echo "   rc $bench_rc, $((SECONDS - t0)) s"
grep -E "ceilings:" "$OUT/bench.log" | head -n 1

echo
echo "tests: $tests_rc   memcheck: $memcheck_rc   bench: $bench_rc   total $((SECONDS - start)) s   (logs in $OUT)"
# The short table (ratio = FlashMLA time / spgraph time; above 1: spgraph faster).
if grep -q "^== attention summary" "$OUT/bench.log"; then
  sed -n '/^== attention summary/,/^== end of attention summary/p' "$OUT/bench.log" | sed '$d'
else
  echo "no summary: bench did not finish; its last lines:"
  tail -n 15 "$OUT/bench.log"
fi
[[ $tests_rc == 0 || $tests_rc == skipped ]] && [[ $memcheck_rc == 0 || $memcheck_rc == skipped ]] && [[ $bench_rc == 0 ]]
