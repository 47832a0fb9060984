#!/usr/bin/env bash
# One device session on the H200: GPU tests, the end-to-end serving test, the PyTorch peer's
# cross-check, then the benchmarks. Full logs and JSON go to $OUT; a short table is printed last.
# Usage, from the repository root on the GPU machine: scripts/h200_run.sh BIN_DIR [quick|full|sanitize] [STEPS]
# (BIN_DIR holds spgraph_gpu_tests, serve_loop and bench built for sm_90a, and COMMIT).
# `sanitize` runs only compute-sanitizer's four tools over the GPU tests of every op and the
# executor (scripts/compute_sanitizer.sh: the four tools at once, one process per case, ~2-4 minutes) and writes its logs and summary to $OUT.
# Environment: BENCH_TABLES (default ABCD) picks bench's tables; SKIP_PEER=1 skips the PyTorch peer.
set -uo pipefail
bin=${1:?usage: scripts/h200_run.sh BIN_DIR [quick|full|sanitize]}
mode=${2:-quick}
if [ "$mode" = sanitize ]; then
  exec "$(dirname "$0")/compute_sanitizer.sh" "$bin"
fi
steps=${3:-1000}
final=${OUT:-/tmp/spgraph-results}
out=/tmp/spgraph-run
rm -rf "$out" && mkdir -p "$out" "$final"
# At most a few files come back from a device run: the JSON records, and every log in one archive.
trap 'cp "$out"/*.json "$final"/ 2>/dev/null; tar czf "$final/logs.tgz" -C "$out" . 2>/dev/null' EXIT
export SPGRAPH_COMMIT=$(cat "$bin/COMMIT" 2>/dev/null || echo unknown)
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used,memory.total --format=csv | tee "$out/gpu.txt"

echo "== GPU tests (8 processes, then the [pool] and [trap] cases alone: scripts/gpu_tests_parallel.sh)"
timeout 420 scripts/gpu_tests_parallel.sh --jobs 8 --out "$out/gpu_tests" "$bin/spgraph_gpu_tests" >"$out/gpu_tests.log" 2>&1
echo "spgraph_gpu_tests exit $?"
cat "$out/gpu_tests.log"
grep -hE "FAILED|failed" "$out"/gpu_tests/*.log | tail -25

echo "== serving loop, end to end"
timeout 300 tests/serve_loop_test.sh "$bin/serve_loop" >"$out/serve_test.log" 2>&1
echo "serve_loop_test exit $?"
grep -E "verified|checksum|allocation|serve_loop_test" "$out/serve_test.log" | tail -8

if [ -f scripts/torch_peer.py ] && [ "${SKIP_PEER:-0}" != 1 ]; then
  echo "== PyTorch peer: self-test, then cross-check on the small workload"
  timeout 120 python3 scripts/torch_peer.py --selftest >"$out/peer_selftest.log" 2>&1
  echo "torch_peer --selftest exit $?"
  tail -3 "$out/peer_selftest.log"
  rm -rf /tmp/spgraph-dump && mkdir -p /tmp/spgraph-dump
  timeout 120 "$bin/bench" --dump /tmp/spgraph-dump --tables - >"$out/dump.log" 2>&1
  timeout 180 python3 scripts/torch_peer.py --check /tmp/spgraph-dump >"$out/peer_check.log" 2>&1
  echo "torch_peer --check exit $?"
  tail -8 "$out/peer_check.log"
fi

echo "== serving loop, $steps steps each mode, allocation calls counted (CUPTI attached)"
for m in graph eager; do
  timeout 400 "$bin/serve_loop" --steps "$steps" --budget 2048 --mode $m --no-progress --json "$out/serve_$m.json" \
    >"$out/serve_$m.log" 2>&1
  echo "serve_loop $m exit $?"
  sed -n '/report/,$p' "$out/serve_$m.log"
done
echo "== serving loop, 2000 steps each mode, host times without CUPTI (--no-alloc-count)"
for m in graph eager; do
  timeout 200 "$bin/serve_loop" --steps 2000 --budget 2048 --mode $m --no-alloc-count --no-progress \
    --json "$out/serve_${m}_host.json" >"$out/serve_${m}_host.log" 2>&1
  echo "serve_loop $m --no-alloc-count exit $?"
  grep -E "host time per chunk|tokens/s" "$out/serve_${m}_host.log"
done

echo "== benchmarks ($mode)"
quick=$([ "$mode" = quick ] && echo --quick)
timeout 420 "$bin/bench" $quick --tables "${BENCH_TABLES:-ABCD}" --json "$out/bench.json" >"$out/bench.log" 2>&1
echo "bench exit $?"
if [ -f scripts/torch_peer.py ] && [ "${SKIP_PEER:-0}" != 1 ]; then
  timeout 300 python3 scripts/torch_peer.py --bench $quick --json "$out/peer.json" >"$out/peer_bench.log" 2>&1
  echo "torch_peer --bench exit $?"
fi
tail -70 "$out/bench.log"
[ -f "$out/peer_bench.log" ] && tail -20 "$out/peer_bench.log"
