#!/usr/bin/env bash
# A/B of whole attention builds (issue 15): times table A's `automatic` path of several `bench`
# binaries in alternating invocations on one host, for variants that are compile-time only (a
# per-TU flag such as --use_fast_math through SPGRAPH_ATTENTION_CUDA_FLAGS, or a kernel switch),
# which scripts/attention_ab.sh cannot time side by side as paths of one binary.
#
# usage: scripts/attention_ab_bins.sh --rows LIST [--rounds N] [--launch MODE] [--burst] [--s-kv N] [--checksum] NAME=BIN_DIR NAME=BIN_DIR ...
#   each BIN_DIR holds a `bench` built for sm_90a; the first NAME is the reference of the A/B
#   --rows    table A rows whose name contains one of the comma-separated parts (required: each
#             invocation measures the ceilings first, about 2 s, so keep the list short)
#   --rounds  invocations per binary (default 2); round r starts with binary r (mod n), so each
#             binary follows each of the others and none is always first
#   --launch  bench's --launch mode: oneshot (default), prepared, chain or gated (docs/benchmarks.md, A)
#   --burst   bench's --burst: 3 (small rows 10) warm-up calls and 20 (50) timed, not the sustained
#             25 ms and 100 ms: with the sustained A/B, how much of a difference is the power cap's
#   --s-kv    bench's --s-kv: every row over N kv rows (named .../kvN, no FlashMLA ratio)
#   --checksum  bench's --checksum: each row's outputs of each invocation checksummed (bench prints
#             "checksum ROW VARIANT 0x..."); the summary's `bits` column says whether a build's
#             checksums equal the first build's in every round (`=`) or not (`DIFF`), and whether
#             the first build's own rounds agree (`ref`, else `UNSTABLE`). For builds that must
#             compute the same bits (a schedule, a cache hint, a diagnostic): any other outcome
#             exits 3 once the summary is printed
# BENCH_TIMEOUT (s, default 600) bounds each invocation, so a stuck one still leaves the summary.
# Writes under $OUT (default /tmp/attention_ab_bins): bench_<NAME>_r<R>.{log,json}, ab_bins.txt.
# Prints last one line per (row, binary): median over the rounds of bench's sustained time (µs),
# each round's time, vs_ref (the first binary's median / this one's: above 1, faster) and ratio
# (FlashMLA's side-by-side figure / this one's).
set -uo pipefail
ROWS=""
ROUNDS=2
LAUNCH=oneshot
BURST=()
SKV=()
CHECKSUM=()
BINS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --rows) ROWS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --launch) LAUNCH=$2; shift 2 ;;
    --burst) BURST=(--burst); shift ;;
    --s-kv) SKV=(--s-kv "$2"); shift 2 ;;
    --checksum) CHECKSUM=(--checksum); shift ;;
    *=*) BINS+=("$1"); shift ;;
    *) echo "$0: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -z $ROWS || ${#BINS[@]} -lt 2 ]]; then
  echo "usage: $0 --rows LIST [--rounds N] [--launch MODE] [--burst] [--s-kv N] [--checksum] NAME=BIN_DIR NAME=BIN_DIR ..." >&2
  exit 2
fi
case $LAUNCH in
  oneshot | prepared | chain | gated) ;;
  *) echo "$0: --launch takes oneshot, prepared, chain or gated, not '$LAUNCH'" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/attention_ab_bins}
mkdir -p "$OUT"
n=${#BINS[@]}
for b in "${BINS[@]}"; do
  [[ -x ${b#*=}/bench ]] || { echo "$0: ${b#*=}/bench missing" >&2; exit 2; }
done
rc_all=0
for ((r = 0; r < ROUNDS; ++r)); do
  for ((k = 0; k < n; ++k)); do
    b=${BINS[$(((k + r) % n))]}
    name=${b%%=*}
    dir=${b#*=}
    t0=$SECONDS
    timeout "${BENCH_TIMEOUT:-600}" "$dir/bench" --tables A --rows "$ROWS" --paths automatic --launch "$LAUNCH" "${BURST[@]}" "${SKV[@]}" "${CHECKSUM[@]}" --json "$OUT/bench_${name}_r$r.json" \
      >"$OUT/bench_${name}_r$r.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && rc_all=$rc
    echo "   round $r $name: rc $rc, $((SECONDS - t0)) s"
  done
done
names=()
for b in "${BINS[@]}"; do names+=("${b%%=*}"); done
python3 - "$OUT" "$ROUNDS" "$LAUNCH" "${#CHECKSUM[@]}" "${names[@]}" <<'EOF' | tee "$OUT/ab_bins.txt"
import json, statistics, sys
out, rounds, launch, checksum, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] != "0", sys.argv[5:]
# bench names the automatic path's record "spgraph", "+MODE" appended for a launch mode other than oneshot
variant = "spgraph" if launch == "oneshot" else "spgraph+" + launch
us = {}        # (row, name) -> [us per round]
flash = {}
rows = []
for name in names:
    for r in range(rounds):
        try:
            recs = json.load(open(f"{out}/bench_{name}_r{r}.json"))
        except (OSError, ValueError):
            continue
        for x in recs:
            if x["suite"] == "attention" and x["variant"] == variant and x["metric"] == "gpu_us":
                us.setdefault((x["name"], name), []).append(x["value"])
                if x["name"] not in rows:
                    rows.append(x["name"])
# FlashMLA's figures are the bench's constants; read them from a log's row lines.
sums = {}      # (row, name) -> [checksum per round that printed one]
for name in names:
    for r in range(rounds):
        try:
            lines = open(f"{out}/bench_{name}_r{r}.log").read().splitlines()
        except OSError:
            continue
        for ln in lines:
            p = ln.split()
            if len(p) == 4 and p[0] == "checksum" and p[2] == variant:
                sums.setdefault((p[1], name), []).append(p[3])
                continue
            if len(p) >= 12 and p[0] in ("V32", "V4-C1", "V4-C2", "V4-C4A-pro", "V4-C128A") or (len(p) >= 12 and p[0].startswith("small-")):
                try:
                    label = p[0] + "/" + p[4] + ("" if p[5] == "4096" else "/sq" + p[5])
                    flash[label] = float(p[10])
                except (ValueError, IndexError):
                    pass
def bits(row, name):
    """The bits column: the first build's rounds agree (ref) or not (UNSTABLE); another build's
    checksums all equal the first build's (=) or not (DIFF); '-' where a build printed none in
    some round."""
    ref, got = sums.get((row, names[0]), []), sums.get((row, name), [])
    if len(got) != rounds or len(ref) != rounds:
        return "-"
    if name == names[0]:
        return "ref" if len(set(got)) == 1 else "UNSTABLE"
    return "=" if len(set(ref)) == 1 and set(got) == set(ref) else "DIFF"

print(f"{'row':28} {'binary':8} {'median_us':>10} {'rounds_us':>24} {'vs_ref':>7} {'ratio':>7}" + ("  bits" if checksum else ""))
bad = []
for row in rows:
    ref = us.get((row, names[0]))
    ref_med = statistics.median(ref) if ref else None
    for name in names:
        v = us.get((row, name))
        b = bits(row, name) if checksum else ""
        if b not in ("", "ref", "="):
            bad.append(f"{row} {name} {b}")
        if not v:
            print(f"{row:28} {name:8} {'-':>10}" + (f"  {b}" if checksum else ""))
            continue
        med = statistics.median(v)
        f = flash.get(row, 0.0)
        print(f"{row:28} {name:8} {med:10.1f} {' / '.join(f'{x:.1f}' for x in v):>24} "
              f"{(ref_med / med if ref_med else 0):7.3f} {(f / med if f else 0):7.3f}" + (f"  {b}" if checksum else ""))
if checksum:
    print("checksums: every build computed the first build's bits on every row" if not bad
          else "checksums differ or are missing: " + "; ".join(bad))
    sys.exit(3 if bad else 0)
EOF
py_rc=${PIPESTATUS[0]}
[[ $rc_all -eq 0 && $py_rc -ne 0 ]] && rc_all=$py_rc
exit $rc_all
