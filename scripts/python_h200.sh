#!/usr/bin/env bash
# The Python package's whole device run in one command, within 9 minutes on the H200: builds the
# extension against a carried install (CMake, find_package(spgraph)), runs the Python suite (GPU
# tests included), compares prefill_loop.py with serve_loop on the same trace (checksum, host time
# per launch, allocation calls), runs bench's tables A (two rows) and C and scripts/python_bench.py
# against them, and prints a short summary table last. No network needed.
#
# Here (no GPU):   cmake --workflow --preset build
#                  cmake --install build/release --prefix build/spgraph-prefix
# Device:          scripts/python_h200.sh build/spgraph-prefix build/release/samples
#                  carry = ["build/spgraph-prefix", "build/release/samples/serve_loop", "build/release/samples/bench"]
# $OUT receives 7 files: summary.txt, pytest.log, pytest.xml, compare.log, bench.log, python_bench.log,
# results.json (every record of serve_loop, prefill_loop, bench and python_bench, docs/results format).
set -uo pipefail
cd "$(dirname "$0")/.."
prefix=${1:?usage: scripts/python_h200.sh PREFIX BIN_DIR (an install of spgraph; the folder of serve_loop and bench)}
bin=$(cd "${2:?usage: scripts/python_h200.sh PREFIX BIN_DIR}" && pwd)
out=${OUT:-/tmp/spgraph-python-h200}
work=/tmp/spgraph-python-h200-work
mkdir -p "$out" "$work"
rm -f "$work"/*.json
export SPGRAPH_COMMIT=${SPGRAPH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export SPGRAPH_SERVE_LOOP="$bin/serve_loop"
export PATH="/usr/local/cuda/bin:$PATH"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s]"; }

# PREFIX "source": build the library here too, with the extension's compiler. An install carried
# from a machine with another g++ crashed the extension in libstdc++'s stream code on the H200
# (2026-12-01): keep the library and the module on one compiler.
if [ "$prefix" = source ]; then
  config=/tmp/spgraph-no-package/spgraphConfig.cmake  # no package there: CMake builds ../
  mkdir -p "$(dirname "$config")"
else
  config=$(find "$prefix" -name spgraphConfig.cmake 2>/dev/null | head -1)
  [ -n "$config" ] || { echo "python_h200: no spgraphConfig.cmake under $prefix" >&2; exit 2; }
fi
say "== spgraph python on the device, commit $SPGRAPH_COMMIT"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
say "$(python3 -c "import sys, torch, nanobind; print('python', sys.version.split()[0], '| torch', torch.__version__,
'cuda', torch.version.cuda, '| nanobind', nanobind.__version__)" 2>&1 | tail -1) | $(cmake --version | head -1)"

# 1. Build the extension (find_package(spgraph) from the install) and run the whole Python suite.
timeout 330 scripts/python_tests.sh "$(dirname "$config")" /tmp/spgraph-python-build -- \
  --junitxml="$out/pytest.xml" --durations=12 >"$out/pytest.log" 2>&1
pytest_rc=$?
export PYTHONPATH=/tmp/spgraph-python-build${PYTHONPATH:+:$PYTHONPATH}
say "extension's C++ runtime: $(ldd /tmp/spgraph-python-build/spgraph/_spgraph*.so 2>/dev/null | grep -o 'libstdc++[^ ]*' | head -1)"
echo "$(stamp) pytest exit $pytest_rc"

# 2. prefill_loop.py against serve_loop on serve_loop's default trace (V4 program, R 4, T 2048),
#    CUPTI unloaded (clean host times), then prefill_loop with the allocation counter attached.
trace=(--steps 250 --checksum --no-progress)
{
  echo "== serve_loop ${trace[*]} --no-alloc-count --json"
  timeout 40 "$bin/serve_loop" "${trace[@]}" --no-alloc-count --json "$work/serve_loop.json"; echo "exit $?"
  echo "== prefill_loop.py ${trace[*]} --no-alloc-count --json"
  timeout 40 python3 samples/python/prefill_loop.py "${trace[@]}" --no-alloc-count --json "$work/prefill_loop.json"
  echo "exit $?"
  echo "== prefill_loop.py --steps 60 --no-progress --json (CUPTI counter attached)"
  timeout 30 python3 samples/python/prefill_loop.py --steps 60 --no-progress --json "$work/prefill_loop_counted.json"
  echo "exit $?"
} >"$out/compare.log" 2>&1
echo "$(stamp) compare done"

# 3. bench: tables A (the two rows python_bench times) and C, then the ops and the executor from Python.
timeout 90 "$bin/bench" --tables AC --rows V4-C2/32768,small-h128-k1152/8192/sq64 --json "$work/bench.json" \
  >"$out/bench.log" 2>&1
echo "bench exit $?" >>"$out/bench.log"
echo "$(stamp) bench done"
timeout 100 python3 scripts/python_bench.py --compare "$work/bench.json" --json "$work/python_bench.json" \
  >"$out/python_bench.log" 2>&1
echo "python_bench exit $?" >>"$out/python_bench.log"
echo "$(stamp) python_bench done"

# 4. One results file and the summary, printed last.
python3 - "$out" "$work" "$pytest_rc" <<'PY' | tee -a "$summary"
import glob, json, os, re, sys
out, work, pytest_rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
records = []
for path in sorted(glob.glob(os.path.join(work, "*.json"))):
    try:
        records += json.load(open(path))
    except Exception as e:
        print(f"{os.path.basename(path)}: unreadable ({e})")
json.dump(records, open(os.path.join(out, "results.json"), "w"), indent=1)
sys.path.insert(0, "scripts")
from junit_summary import summarize
try:
    counts, failed = summarize(os.path.join(out, "pytest.xml"), 160)
    failed = [f"  FAILED {f}" for f in failed]
except Exception as e:
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    print(f"pytest: no JUnit report ({e}); see pytest.log")
print(f"\n== summary\npytest (exit {pytest_rc}): {counts['passed']} passed, {counts['failed']} failed, "
      f"{counts['skipped']} skipped")
print("\n".join(failed[:12]))
log = open(os.path.join(out, "compare.log")).read()
sums = re.findall(r"output checksum\s+([0-9a-f]{16})", log)
print(f"checksum serve_loop {sums[0] if sums else '-'} prefill_loop {sums[1] if len(sums) > 1 else '-'}: "
      f"{'EQUAL' if len(sums) > 1 and sums[0] == sums[1] else 'DIFFERENT or missing'}")
def value(name_prefix, metric):
    for r in records:
        if r["suite"] == "executor" and r["name"].startswith(name_prefix) and r["metric"] == metric:
            return r["value"]
    return float("nan")
print(f"{'host us per launch':28s} {'p50':>8s} {'p99':>8s} {'gpu p50':>9s} {'tok/s':>9s} {'alloc':>6s}")
for label, name in (("serve_loop (C++ run())", "serve_loop/no-cupti"), ("prefill_loop (Python run)", "prefill_loop/no-cupti"),
                    ("prefill_loop, CUPTI on", "prefill_loop/default")):
    print(f"{label:28s} {value(name, 'host_us_p50'):8.2f} {value(name, 'host_us_p99'):8.2f} "
          f"{value(name, 'gpu_us_p50'):9.1f} {value(name, 'tokens_per_s'):9.0f} {value(name, 'alloc_calls'):6.0f}")
pb = open(os.path.join(out, "python_bench.log")).read()
i = pb.find("== python_bench: ops")
print(pb[i:].rstrip() if i >= 0 else "python_bench: no table (see python_bench.log)")
PY
exit "$pytest_rc"
